"""A packed batch -> what the loss needs, shared by training, evaluation and calibration:
the target capture (documents of a packed row never see each other) and the anchor blocks."""

from __future__ import annotations

from common.target import Capture, TargetCapture
from train.data import document_causal_mask
from train.loop.anchors import sample_anchors
from train.loop.loss import BlockTargets, block_targets


def capture_batch(capture: TargetCapture, batch: dict) -> Capture:
    """Target forward over `batch["input_ids"]`, per-document causal when the rows are packed
    (a dense [B, 1, L, L] mask, or a flex-attention BlockMask for a target whose attention
    implementation is flex_attention: its kernel skips the tiles outside every document)."""
    if "doc_ids" not in batch:
        return capture(batch["input_ids"])
    flex = getattr(capture.model.config, "_attn_implementation", None) == "flex_attention"
    doc_ids = batch["doc_ids"]
    mask = document_causal_block_mask(doc_ids) if flex else document_causal_mask(doc_ids)
    return capture(batch["input_ids"], attention_mask=mask, position_ids=batch["position_ids"])


def document_causal_block_mask(doc_ids):
    """`document_causal_mask`'s rule (query q sees keys k <= q of its own document; padding, -1,
    sees padding) as a flex-attention `BlockMask` [B, 1, L, L]."""
    from torch.nn.attention.flex_attention import create_block_mask

    n, t = doc_ids.shape

    def mask_mod(b, _h, q, k):
        return (k <= q) & (doc_ids[b, q] == doc_ids[b, k])

    return create_block_mask(
        mask_mod, n, None, t, t, device=doc_ids.device, _compile=doc_ids.is_cuda
    )


def anchor_blocks(
    batch: dict,
    draft_cfg,
    t2d,
    num_anchors: int,
    seed: int,
    step: int,
    decay: float,
    host: dict | None = None,
):
    """-> (anchors [N, A], valid [N, A], BlockTargets) for one batch at `step` (-1: evaluation).
    The sampler draws on the CPU from each row's content: `host` is the batch's CPU copy where
    the caller has one (no device sync); otherwise the batch is copied to the CPU here (one
    copy per tensor, not a sync per row)."""
    dev = batch["loss_mask"].device
    keys = ("loss_mask", "input_ids", "doc_ids")
    cpu = host if host is not None else {k: batch[k].cpu() for k in keys if k in batch}
    anchors, valid = sample_anchors(
        cpu["loss_mask"], num_anchors, seed, step, cpu["input_ids"], cpu.get("doc_ids")
    )
    anchors, valid = anchors.to(dev, non_blocking=True), valid.to(dev, non_blocking=True)
    return anchors, valid, blocks_at(batch, draft_cfg, t2d, anchors, valid, decay)


def blocks_at(batch: dict, draft_cfg, t2d, anchors, valid, decay: float) -> BlockTargets:
    """The loss's targets for blocks at the given anchors [N, A] (valid: [N, A] bool)."""
    return block_targets(
        batch["input_ids"],
        batch["loss_mask"],
        anchors,
        valid,
        draft_cfg.num_speculative_tokens,
        t2d,
        decay,
        batch.get("doc_ids"),
    )
