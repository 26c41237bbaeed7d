"""Reduced draft vocabulary: token counts -> (d2t, t2d), exactly as pinned in dspark.md.

Selection: the top `draft_vocab_size` target ids by (-count, id) over loss-masked tokens; if fewer
ids were ever seen, pad with the lowest unused ids; sort ascending. Then
`d2t[i] = selected[i] - i` (int64; target = draft + d2t[draft]) and `t2d = bool[V]` marks the
selected ids. Deterministic: ties break by id. The counts' hash is recorded so a cached map is
reused only for the same counts and size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VocabMap:
    d2t: torch.Tensor  # [Vd] int64
    t2d: torch.Tensor  # [V] bool
    counts_hash: str
    draft_vocab_size: int

    @property
    def selected(self) -> torch.Tensor:
        """[Vd] target id of each draft id, ascending."""
        return torch.arange(self.draft_vocab_size) + self.d2t

    def to_dict(self) -> dict:
        return {"d2t": self.d2t, "t2d": self.t2d}


def counts_hash(counts: torch.Tensor) -> str:
    """sha256 of the int64 counts vector (little-endian bytes)."""
    return hashlib.sha256(counts.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> VocabMap:
    """counts: [V] int (loss-masked token counts of the target vocab) -> VocabMap."""
    counts = counts.to(torch.int64).cpu()
    v = counts.numel()
    if not 1 <= draft_vocab_size <= v:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in [1, {v}]")
    ids = torch.arange(v)
    # Sort by (-count, id): stable sort on id order, then by descending count.
    order = torch.sort(-counts, stable=True).indices
    seen = order[counts[order] > 0][:draft_vocab_size]
    if seen.numel() < draft_vocab_size:
        unused = torch.ones(v, dtype=torch.bool)
        unused[seen] = False
        pad = ids[unused][: draft_vocab_size - seen.numel()]  # lowest unused ids
        seen = torch.cat([seen, pad])
    selected = torch.sort(seen).values
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[selected] = True
    d2t = selected - torch.arange(draft_vocab_size)
    return VocabMap(d2t, t2d, counts_hash(counts), draft_vocab_size)


def check_vocab_map(d2t: torch.Tensor, target_vocab_size: int) -> list[str]:
    """Problems with a d2t map (empty list = fine): dtype, range, strictly increasing targets."""
    problems = []
    if d2t.dtype != torch.int64:
        problems.append(f"d2t dtype is {d2t.dtype}, must be int64")
    tgt = torch.arange(d2t.numel()) + d2t.to(torch.int64).cpu()
    if d2t.numel() and (tgt.min() < 0 or tgt.max() >= target_vocab_size):
        problems.append(
            f"d2t maps draft ids to target ids outside [0, {target_vocab_size}) "
            f"(min {int(tgt.min())}, max {int(tgt.max())})"
        )
    if d2t.numel() > 1 and not bool((tgt[1:] > tgt[:-1]).all()):
        problems.append("d2t targets are not strictly increasing (draft ids must be sorted)")
    return problems
