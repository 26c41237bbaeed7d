"""DataLoader over packed rows with a resumable, rank-sharded position.

Batch dict (all `[B, seq_len]`; B = micro batch per rank, smaller only with drop_last=False):
    input_ids    int64   target token ids; padding = tokenizer pad/eos id
    loss_mask    bool    supervised tokens (never the first token of a document, never padding)
    position_ids int64   restart at 0 at each document (and for the padding tail)
    doc_ids      int64   0.. per document within the row, -1 on padding

Usage (the epoch loop must be driven by the loader so a resume lands in the right epoch):

    loader = build_dataloader(ds, batch_size=8, seed=0, rank=r, world_size=w)
    loader.load_state_dict(ckpt["data"])          # optional resume
    while loader.epoch < num_epochs:
        for batch in loader:                       # the rest of the current epoch
            ...; ckpt["data"] = loader.state_dict() # position already counts this batch
"""

import datasets
import torch
from torch.utils.data import DataLoader

from train.data.sampler import ResumableBatchSampler

COLUMNS = ("input_ids", "loss_mask", "position_ids", "doc_ids")


class _Rows(torch.utils.data.Dataset):
    """Fetches a whole batch of rows with one Arrow read (`__getitems__`) instead of B reads."""

    def __init__(self, dataset: datasets.Dataset):
        self.ds = dataset.with_format("numpy", columns=list(COLUMNS))

    def __len__(self) -> int:
        return len(self.ds)

    def __getitems__(self, indices: list[int]) -> dict:
        return self.ds[indices]


def collate(batch: dict) -> dict[str, torch.Tensor]:
    """Column dict of numpy `[B, L]` arrays -> tensors with the dtypes in the module doc."""
    out = {k: torch.as_tensor(batch[k]).long() for k in ("input_ids", "position_ids", "doc_ids")}
    out["loss_mask"] = torch.as_tensor(batch["loss_mask"]).bool()
    return out


def document_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """`[B, L]` doc ids -> `[B, 1, L, L]` bool: True where query q may attend key k<=q of its doc.

    Padding (-1) attends to padding only, so no row is fully masked (which would give NaN in SDPA).
    """
    L = doc_ids.shape[-1]
    causal = torch.ones(L, L, dtype=torch.bool, device=doc_ids.device).tril()
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # [B, L, L]
    return (same & causal)[:, None]


class ResumableDataLoader:
    """Iterating yields the remainder of the current epoch; see the module doc for the loop."""

    def __init__(
        self, dataset, batch_size, *, seed, rank, world_size, shuffle, drop_last, **dl_kwargs
    ):
        missing = [c for c in COLUMNS if c not in dataset.column_names]
        if missing:
            raise ValueError(f"dataset lacks columns {missing}; build it with build_dataset()")
        if not 0 <= rank < world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.rows = _Rows(dataset)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.dl_kwargs = dl_kwargs
        self.epoch, self.consumed = 0, 0

    def sampler(self) -> ResumableBatchSampler:
        return ResumableBatchSampler(
            len(self.rows),
            self.batch_size,
            self.epoch,
            self.consumed,
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )

    def __len__(self) -> int:
        """Batches left in the current epoch for this rank."""
        return len(self.sampler())

    def __iter__(self):
        loader = DataLoader(
            self.rows, batch_sampler=self.sampler(), collate_fn=collate, **self.dl_kwargs
        )
        step = self.batch_size * self.world_size
        for batch in loader:
            # Advance before yielding: a checkpoint taken while the consumer holds this batch must
            # resume after it.
            self.consumed = min(self.consumed + step, len(self.rows))
            yield batch
        self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "num_rows": len(self.rows),
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (
            ("seed", self.seed),
            ("num_rows", len(self.rows)),
            ("shuffle", self.shuffle),
        ):
            if state[key] != mine:
                raise ValueError(
                    f"data loader state has {key}={state[key]!r} but this run has {mine!r}: the "
                    "sample order would differ, so the resume would repeat or skip data. Restore "
                    "the same data/seed, or start the data position afresh."
                )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


def build_dataloader(
    dataset: datasets.Dataset,
    batch_size: int,
    *,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    shuffle: bool = True,
    drop_last: bool = True,
    num_workers: int = 0,
    pin_memory: bool = False,
) -> ResumableDataLoader:
    """Loader of this rank's `[batch_size, seq_len]` batches (micro batch per rank)."""
    return ResumableDataLoader(
        dataset,
        batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=pin_memory,
    )
