"""Anchor sampling (dspark.md): valid p has loss_mask[p] & loss_mask[p+1] (same document);
up to `num_anchors` per sequence, uniformly without replacement.

Randomness is keyed by (seed, step, the row's content): a fresh generator per row, so
- a resumed run draws exactly the anchors the uninterrupted run drew (no RNG state to save);
- a row gets the same anchors whichever rank or micro-batch holds it, so a data-parallel run is
  the same computation as one process with the same global batch
  (tests/dist/test_distributed_train.py).
"""

from __future__ import annotations

import hashlib

import torch


def valid_anchor_mask(loss_mask: torch.Tensor, doc_ids: torch.Tensor | None = None):
    """[N, T] bool -> [N, T] bool: positions that may anchor a block."""
    ok = torch.zeros_like(loss_mask, dtype=torch.bool)
    ok[:, :-1] = loss_mask[:, :-1].bool() & loss_mask[:, 1:].bool()
    if doc_ids is not None:
        ok[:, :-1] &= doc_ids[:, :-1] == doc_ids[:, 1:]
    return ok


def answer_head_mask(
    loss_mask: torch.Tensor, n: int, doc_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """[N, T] loss_mask keeping only the first `n` tokens of each answer (a run of loss tokens
    within one document): anchors and labels of the blocks a request of `n` new tokens meets."""
    lm = loss_mask.bool()
    prev = torch.zeros_like(lm)
    prev[:, 1:] = lm[:, :-1]
    if doc_ids is not None:
        prev[:, 1:] &= doc_ids[:, 1:] == doc_ids[:, :-1]
    pos = torch.arange(lm.shape[1], device=lm.device).expand_as(lm)
    start = torch.where(lm & ~prev, pos, torch.zeros_like(pos)).cummax(dim=1).values
    return (lm & (pos - start < n)).to(loss_mask.dtype)


def row_generator(seed: int, step: int, row_ids: torch.Tensor) -> torch.Generator:
    """Generator keyed by (seed, step, content of the row)."""
    h = hashlib.blake2b(row_ids.to(torch.int64).cpu().numpy().tobytes(), digest_size=8)
    h.update(f"{seed}:{step}".encode())
    g = torch.Generator()
    g.manual_seed(int.from_bytes(h.digest(), "little") & ((1 << 63) - 1))
    return g


def sample_anchors(
    loss_mask: torch.Tensor,  # [N, T]
    num_anchors: int,
    seed: int,
    step: int,
    input_ids: torch.Tensor,  # [N, T] (keys the randomness)
    doc_ids: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,  # [N, T] bool: draw only among these valid positions
    pad_to: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (anchors [N, A] long, valid [N, A] bool), A = min(num_anchors, max valid count), or
    `pad_to` columns where given (a fixed shape whatever the count).

    Anchors are sorted per row; padding entries point at position 0 and are marked invalid.
    """
    ok = valid_anchor_mask(loss_mask, doc_ids).cpu()
    if allowed is not None:
        ok &= allowed.cpu().bool()
    n, t = ok.shape
    a = max(1, min(num_anchors, int(ok.sum(1).max())))
    if pad_to is not None:
        if pad_to < a:
            raise ValueError(f"pad_to={pad_to} is below the {a} anchors drawn")
        a = min(pad_to, t)
    # Random keys, -1 on invalid positions: the top-a keys of a row are a uniform sample
    # without replacement of its valid positions (all of them if it has fewer than a).
    keys = torch.stack([torch.rand(t, generator=row_generator(seed, step, r)) for r in input_ids])
    keys = torch.where(ok, keys, torch.tensor(-1.0))
    top = keys.topk(a, dim=1)
    valid = top.values >= 0
    anchors = torch.where(valid, top.indices, 0)
    order = torch.where(valid, anchors, t).argsort(dim=1)  # sort valid anchors, padding last
    anchors, valid = anchors.gather(1, order), valid.gather(1, order)
    return anchors.to(loss_mask.device), valid.to(loss_mask.device)
