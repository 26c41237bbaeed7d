"""A packed batch -> what the loss needs, shared by training, evaluation and calibration:
the target capture (documents of a packed row never see each other) and the anchor blocks."""

from __future__ import annotations

from common.target import Capture, TargetCapture
from train.anchors import sample_anchors
from train.data import document_causal_mask
from train.loss import BlockTargets, block_targets


def capture_batch(capture: TargetCapture, batch: dict) -> Capture:
    """Target forward over `batch["input_ids"]`, per-document causal when the rows are packed."""
    if "doc_ids" not in batch:
        return capture(batch["input_ids"])
    return capture(
        batch["input_ids"],
        attention_mask=document_causal_mask(batch["doc_ids"]),
        position_ids=batch["position_ids"],
    )


def anchor_blocks(
    batch: dict, draft_cfg, t2d, num_anchors: int, seed: int, step: int, decay: float
):
    """-> (anchors [N, A], valid [N, A], BlockTargets) for one batch at `step` (-1: evaluation)."""
    doc_ids = batch.get("doc_ids")
    anchors, valid = sample_anchors(
        batch["loss_mask"], num_anchors, seed, step, batch["input_ids"], doc_ids
    )
    tg: BlockTargets = block_targets(
        batch["input_ids"],
        batch["loss_mask"],
        anchors,
        valid,
        draft_cfg.num_speculative_tokens,
        t2d,
        decay,
        doc_ids,
    )
    return anchors, valid, tg
