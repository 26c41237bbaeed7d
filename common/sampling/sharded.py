"""Tensor-parallel batch-sharded sequential sampling (vLLM 0.34 DSparkSpeculator's
`_sample_sequential_sharded`, re-implemented on torch.distributed).

Without sharding every TP rank runs the whole Markov walk over the full-vocab logits of every
request. Here request i is owned by rank i % tp, so no rank owns more than cap = cdiv(R, tp):
1. each rank computes its vocab shard of the base logits for all requests, rows in owner-sorted
   order (rank 0's requests, then rank 1's, ...; padding slots read request 0);
2. an all-to-all turns vocab shards into batch shards: each rank gets the full-vocab rows of its
   own requests;
3. each rank runs the Markov walk on its cap rows (Markov and confidence weights are replicated);
4. an all-gather of tokens, with fp32 confidences bit-packed into int64 (viewed as int32, then
   widened), returns everything in batch order on every rank.
All shapes depend only on R, so the step can be captured in a CUDA graph. Padding rows are
sampled and discarded.

Confidences (`confidence="recompute"`, the default here, differs from vLLM): a confidence depends
only on the slot's hidden and the Markov embedding of the previous token, and every rank has all
drafts after the token all-gather, so each rank recomputes all R*N confidences with the very call
the replicated walk makes. That is bit-identical to the replicated walk by construction; the
vLLM way (`confidence="gather"`: local confidences, bit-packed into the all-gather) is bitwise
equal only if `compute_confidence` is batch-invariant, which a BLAS GEMV over a different number
of rows is not (e.g. torch CPU nn.Linear(H + r, 1) differs in the last bit at some row counts).
The recompute costs one R*N x (H + r) GEMV, negligible next to the lm_head.

Collectives: NCCL uses all_to_all_single; `a2a="all_gather"` builds the same exchange from an
all-gather plus slicing for backends without all-to-all. Both give identical results.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.sampling.draft_probs import DraftProbs
from common.sampling.markov_walk import (
    ProbsMode,
    has_confidence_head,
    markov_walk,
    model_config,
)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sharding_disabled_reason(
    *,
    model,
    tp_size: int,
    draft_logits_replicated: bool = False,
    use_acceptance_estimator: bool = False,
    draft_topk: int | None = None,
    lm_head_tp_size: int | None = None,
    communicator: object | None = None,
) -> str | None:
    """Why sequential sampling must stay replicated across TP ranks, or None if it can be sharded.

    Checks the seed's preconditions in its order. The caller has already checked tp_size > 1 and
    that batch-sharded sampling is enabled.

    Args:
        model: the draft model.
        tp_size: tensor-parallel world size.
        draft_logits_replicated: a draft-logits cache exists and is replicated (no row mapping).
        use_acceptance_estimator: the online acceptance estimator is on.
        draft_topk: the top-k Markov candidate count, if set.
        lm_head_tp_size: TP size the lm_head is sharded for; None means the model slices its
            lm_head per call (`compute_draft_logits_local(h, rank, world_size)`, common.model).
        communicator: the TP group's communicator (None: unavailable).
    """
    if draft_logits_replicated:
        return "the draft logits cache is replicated"
    if use_acceptance_estimator:
        return "the online acceptance estimator fits on every request's draft logits on every rank"
    if draft_topk is not None:
        return "top-k Markov sampling is not supported"
    if hasattr(model, "sample_sequential"):
        return "the draft model fuses its own sequential sampling"
    if not hasattr(model, "compute_draft_logits_local") or (
        lm_head_tp_size is not None and lm_head_tp_size != tp_size
    ):
        return "the draft model cannot compute vocab-sharded draft logits"
    if communicator is None:
        return "no communicator is available for the TP group"
    return None


def owner_layout(num_reqs: int, tp_size: int, device=None):
    """Owner-sorted request layout.

    Returns:
        send_reqs: [tp, cap] int64; row r lists the requests rank r owns (r, r + tp, ...), -1 pads.
        src_idx: [R] int64; row of the gathered [tp * cap, ...] tensor holding request i.
    """
    cap = cdiv(num_reqs, tp_size)
    ranks = torch.arange(tp_size, device=device).unsqueeze(1)
    send = torch.arange(cap, device=device) * tp_size + ranks  # [tp, cap]
    send = torch.where(send < num_reqs, send, -1)
    i = torch.arange(num_reqs, device=device)
    return send, (i % tp_size) * cap + i // tp_size


def all_to_all_rows(send: torch.Tensor, group=None, a2a: str = "auto") -> torch.Tensor:
    """send: [tp, ...], chunk j destined for rank j -> recv [tp, ...], chunk i from rank i.

    a2a: "all_to_all_single", "all_gather" (all-gather every chunk, keep ours) or "auto"
    (all_to_all_single on NCCL, all_gather otherwise).
    """
    if a2a == "auto":
        a2a = "all_to_all_single" if dist.get_backend(group) == "nccl" else "all_gather"
    send = send.contiguous()
    if a2a == "all_to_all_single":
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        return recv
    if a2a != "all_gather":
        raise ValueError(f"a2a={a2a!r}: choose auto, all_to_all_single or all_gather")
    rank = dist.get_rank(group)
    return all_gather_rows(send.unsqueeze(0), group)[:, rank]


def all_gather_rows(x: torch.Tensor, group=None) -> torch.Tensor:
    """[n, ...] on every rank -> [tp * n, ...] concatenated in rank order."""
    tp = dist.get_world_size(group)
    x = x.contiguous()
    out = x.new_empty((tp * x.shape[0], *x.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x, group=group)
    return out


@dataclass
class ShardedWalkOutput:
    """draft_ids [R, N] and confidence [R, N] | None in batch order on every rank; local_reqs
    [cap] the requests this rank sampled (-1 = padding); local_probs their DraftProbs
    (rows aligned with local_reqs) when requested."""

    draft_ids: torch.Tensor
    confidence: torch.Tensor | None
    local_reqs: torch.Tensor
    local_probs: DraftProbs | None


@torch.no_grad()
def sharded_markov_walk(
    model,
    hidden: torch.Tensor,
    anchor_ids: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    group=None,
    a2a: str = "auto",
    probs: ProbsMode = "none",
    with_confidence: bool | None = None,
    confidence: str = "recompute",
    fp64: bool = False,
) -> ShardedWalkOutput:
    """`markov_walk` over `model.compute_draft_logits(hidden)`, batch-sharded over `group`.

    Args:
        hidden: [R, N, H] head hidden of the drafted slots, identical on every rank.
        anchor_ids, temperature, seeds, positions: [R], as in `markov_walk`.
        group, a2a: process group and all-to-all method (see `all_to_all_rows`).
        probs: DraftProbs of the local rows ("none" when the caller verifies greedily).
        confidence: "recompute" or "gather" (see the module docstring).
    """
    if confidence not in ("recompute", "gather"):
        raise ValueError(f"confidence={confidence!r}: choose recompute or gather")
    if with_confidence is None:
        with_confidence = has_confidence_head(model)
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    R, N, H = hidden.shape
    vd = model_config(model).draft_vocab_size or model_config(model).vocab_size
    cap = cdiv(R, tp)
    send_reqs, src_idx = owner_layout(R, tp, hidden.device)
    send_hidden = hidden[send_reqs.clamp(min=0)]  # [tp, cap, N, H]
    local_logits = model.compute_draft_logits_local(send_hidden.reshape(-1, H), rank, tp)
    shard = local_logits.shape[-1]
    recv = all_to_all_rows(local_logits.view(tp, cap * N, shard), group, a2a)  # [tp, cap*N, S]
    base = recv.permute(1, 0, 2).reshape(cap, N, tp * shard)[..., :vd]  # [cap, N, Vd]

    local_reqs = send_reqs[rank]
    mine = local_reqs.clamp(min=0)
    out = markov_walk(
        model,
        base,
        send_hidden[rank],
        anchor_ids[mine],
        temperature[mine],
        seeds[mine],
        positions[mine],
        probs=probs,
        with_confidence=with_confidence and confidence == "gather",
        fp64=fp64,
    )
    packed = out.draft_ids.long()  # [cap, N]
    if out.confidence is not None:
        bits = out.confidence.float().contiguous().view(torch.int32).long()
        packed = torch.cat([packed, bits], dim=1)  # [cap, 2N]
    gathered = all_gather_rows(packed, group)[src_idx]  # [R, N or 2N]
    draft_ids = gathered[:, :N]
    conf = None
    if out.confidence is not None:
        conf = gathered[:, N:].int().view(torch.float32)
    elif with_confidence:
        # Same inputs, same call, same shapes as markov_walk's: bit-identical confidences.
        prev = torch.cat([anchor_ids.long().unsqueeze(1), draft_ids[:, :-1]], dim=1)  # [R, N]
        emb = model.markov_embed(prev.flatten())  # [R * N, r], ordered (req, slot)
        conf = model.compute_confidence(hidden.flatten(0, 1), emb).float().view(R, N)
    return ShardedWalkOutput(draft_ids, conf, local_reqs, out.draft_probs)
