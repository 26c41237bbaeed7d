"""Block attention masks (True = the query may attend the key).

Key axis layout is always `[context keys (C) ; block keys (Q)]`, matching `DraftAttention`.
Rule (dspark.md): a block anchored at position p sees context keys at positions < p (of its own
document when sequences are packed) and every key of its own block, bidirectionally.
"""

from __future__ import annotations

import torch


def training_block_mask(
    anchors: torch.Tensor,  # [N, A] anchor positions p
    seq_len: int,  # T: context keys are the whole sequence
    block_size: int,  # B
    doc_ids: torch.Tensor | None = None,  # [N, T] document id of each position (packing)
) -> torch.Tensor:
    """-> [N, A*B, T + A*B] bool for all anchor blocks of a sequence in one pass."""
    n, a = anchors.shape
    t = torch.arange(seq_len, device=anchors.device)
    ctx = t.view(1, 1, -1) < anchors.unsqueeze(-1)  # [N, A, T]
    if doc_ids is not None:
        anchor_doc = doc_ids.gather(1, anchors)  # [N, A]
        ctx = ctx & (doc_ids.unsqueeze(1) == anchor_doc.unsqueeze(-1))
    blk = torch.eye(a, dtype=torch.bool, device=anchors.device)  # block a sees only block a
    blk = blk.repeat_interleave(block_size, 0).repeat_interleave(block_size, 1)  # [A*B, A*B]
    ctx = ctx.repeat_interleave(block_size, dim=1)  # [N, A*B, T]
    return torch.cat([ctx, blk.unsqueeze(0).expand(n, -1, -1)], dim=-1)


def inference_block_mask(ctx_lens: torch.Tensor, ctx_capacity: int, block_size: int):
    """-> [R, B, C + B] bool for R requests whose context K/V are left-aligned in a buffer of
    `ctx_capacity` slots, `ctx_lens[r]` of them valid (request r's anchor is at position
    ctx_lens[r])."""
    r = ctx_lens.shape[0]
    t = torch.arange(ctx_capacity, device=ctx_lens.device)
    ctx = (t.view(1, -1) < ctx_lens.view(-1, 1)).unsqueeze(1).expand(r, block_size, -1)
    blk = torch.ones(r, block_size, block_size, dtype=torch.bool, device=ctx_lens.device)
    return torch.cat([ctx, blk], dim=-1)


def training_block_mask_flex(
    anchors: torch.Tensor,  # [N, A]
    seq_len: int,
    block_size: int,
    doc_ids: torch.Tensor | None = None,  # [N, T]
):
    """The rule of `training_block_mask` as a flex-attention `BlockMask` (query a*B+i, key
    `[context (T) ; blocks (A*B)]`): the kernel then skips the key tiles a block cannot see
    (context after its anchor, other blocks) instead of reading a dense [A*B, T+A*B] mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    n, a = anchors.shape
    t, b = seq_len, block_size
    anchor_doc = doc_ids.gather(1, anchors) if doc_ids is not None else None

    def mask_mod(bi, _h, q_idx, kv_idx):
        blk = q_idx // b
        p = anchors[bi, blk]
        in_ctx = kv_idx < t
        ctx_ok = kv_idx < p
        if doc_ids is not None:
            ctx_ok = ctx_ok & (doc_ids[bi, kv_idx.clamp(max=t - 1)] == anchor_doc[bi, blk])
        same_block = (kv_idx - t) // b == blk
        return torch.where(in_ctx, ctx_ok, same_block)

    return create_block_mask(
        mask_mod, n, None, a * b, t + a * b, device=anchors.device, _compile=anchors.is_cuda
    )
