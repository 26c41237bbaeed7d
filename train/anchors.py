"""Anchor sampling (dspark.md): valid p has loss_mask[p] & loss_mask[p+1] (same document);
up to `num_anchors` per sequence, uniformly without replacement.

Randomness is keyed by (seed, step, rank, micro-batch) through a fresh `torch.Generator`, so a
resumed run draws exactly the anchors the uninterrupted run would have, with no RNG state to save.
"""

from __future__ import annotations

import torch


def valid_anchor_mask(loss_mask: torch.Tensor, doc_ids: torch.Tensor | None = None):
    """[N, T] bool -> [N, T] bool: positions that may anchor a block."""
    ok = torch.zeros_like(loss_mask, dtype=torch.bool)
    ok[:, :-1] = loss_mask[:, :-1].bool() & loss_mask[:, 1:].bool()
    if doc_ids is not None:
        ok[:, :-1] &= doc_ids[:, :-1] == doc_ids[:, 1:]
    return ok


def sample_anchors(
    loss_mask: torch.Tensor,  # [N, T]
    num_anchors: int,
    generator: torch.Generator,
    doc_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (anchors [N, A] long, valid [N, A] bool), A = min(num_anchors, max valid count).

    Anchors are sorted per row; padding entries point at position 0 and are marked invalid.
    """
    ok = valid_anchor_mask(loss_mask, doc_ids).cpu()
    n, t = ok.shape
    a = max(1, min(num_anchors, int(ok.sum(1).max())))
    # Random keys, -inf on invalid positions: top-a keys = uniform sample without replacement.
    keys = torch.rand(n, t, generator=generator)
    keys = torch.where(ok, keys, torch.tensor(-1.0))
    top = keys.topk(a, dim=1)
    valid = top.values >= 0
    anchors = torch.where(valid, top.indices, 0)
    order = torch.where(valid, anchors, t).argsort(dim=1)  # sort valid anchors, padding last
    anchors, valid = anchors.gather(1, order), valid.gather(1, order)
    return anchors.to(loss_mask.device), valid.to(loss_mask.device)


def anchor_generator(seed: int, step: int, rank: int, micro: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(((seed * 1_000_003 + step) * 1_009 + rank) * 101 + micro)
    return g
