"""Counts of loss-masked tokens: the input to the reduced draft vocab (dspark.md, Reduced vocab)."""

import datasets
import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm


def _flat(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False)


def _batches(dataset: datasets.Dataset, batch_size: int, desc: str, progress: bool):
    ds = dataset.with_format("arrow", columns=["input_ids", "loss_mask"])
    total = -(-len(ds) // batch_size)
    for batch in tqdm(ds.iter(batch_size), total=total, desc=desc, disable=not progress):
        yield _flat(batch["input_ids"]), _flat(batch["loss_mask"]).astype(bool)


def count_loss_tokens(
    dataset: datasets.Dataset, vocab_size: int, *, batch_size: int = 1024, progress: bool = True
) -> torch.LongTensor:
    """`[vocab_size]` int64 counts of token ids where `loss_mask` is True.

    Works on tokenized samples or packed rows (both have `input_ids` and `loss_mask`). `vocab_size`
    is the target's full vocab (`config.vocab_size`); an id outside it is an error, not dropped.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids, mask in _batches(dataset, batch_size, "count loss tokens", progress):
        picked = ids[mask]
        if picked.size and (picked.max() >= vocab_size or picked.min() < 0):
            raise ValueError(
                f"token id {int(picked.max())} is outside vocab_size={vocab_size}; pass the "
                "target's config.vocab_size and the target's tokenizer"
            )
        counts += np.bincount(picked, minlength=vocab_size)
    return torch.from_numpy(counts)


def dataset_stats(dataset: datasets.Dataset, *, batch_size: int = 1024) -> dict[str, int]:
    """Token totals for logging: `tokens` (all, incl. padding), `padding`, `supervised`."""
    stats = {"rows": len(dataset), "tokens": 0, "padding": 0, "supervised": 0}
    ds = dataset.with_format("arrow")
    has_docs = "doc_ids" in dataset.column_names
    for batch in ds.iter(batch_size):
        ids = _flat(batch["input_ids"])
        stats["tokens"] += ids.size
        stats["supervised"] += int(_flat(batch["loss_mask"]).astype(bool).sum())
        if has_docs:
            stats["padding"] += int((_flat(batch["doc_ids"]) < 0).sum())
    return stats
