"""Deterministic, shardable batch order with an explicit position.

Global order in epoch e: `perm_e` = a permutation of range(N) seeded by (seed, e) (identity
when `shuffle=False`). The position is `(epoch, consumed)`, `consumed` = global samples already
consumed in that epoch. From offset `c`, global batch g is `perm_e[c + g*B*W : c + (g+1)*B*W]`
and rank r takes its slice `[r*B : (r+1)*B]`, so ranks never overlap and, because the position
counts samples rather than batches, a run may resume with another micro-batch size or world size.

`drop_last=True` (training): only full global batches; the N mod (B*W) leftover differs per epoch
(fresh permutation) so no row is systematically dropped, and every rank gets the same batch count.
`drop_last=False` (evaluation): the leftover is split into W near-equal contiguous pieces, so
ranks may get a short or no final batch; do not run per-batch collectives then.
"""

import numpy as np


def epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    if not shuffle:
        return np.arange(num_rows)
    return np.random.default_rng([seed, epoch]).permutation(num_rows)


def rank_batches(
    order: np.ndarray,
    start: int,
    batch_size: int,
    rank: int,
    world_size: int,
    drop_last: bool = True,
) -> list[list[int]]:
    """This rank's batches of `order[start:]` (see module doc)."""
    step = batch_size * world_size
    out = []
    for g in range(start, len(order), step):
        chunk = order[g : g + step]
        if len(chunk) == step:
            out.append(chunk[rank * batch_size : (rank + 1) * batch_size].tolist())
        elif not drop_last:
            piece = np.array_split(chunk, world_size)[rank]
            if len(piece):
                out.append(piece.tolist())
    return out


class ResumableBatchSampler:
    """Iterable of this rank's batches (lists of row indices) for one epoch, from a given offset.

    Stateless apart from its arguments; `ResumableDataLoader` owns the position and advances it only
    when a batch reaches the consumer (workers prefetch ahead of that point).
    """

    def __init__(
        self, num_rows, batch_size, epoch, start, *, seed, rank, world_size, shuffle, drop_last
    ):
        order = epoch_order(num_rows, seed, epoch, shuffle)
        self.batches = rank_batches(order, start, batch_size, rank, world_size, drop_last)

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)
