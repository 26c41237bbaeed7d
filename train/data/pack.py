"""Turn variable-length samples into fixed `[seq_len]` rows: packing (default) or bucketing.

Design choices:
- `mode="pack"`: samples are shuffled with `seed`, then placed first-fit into rows within windows
  of `window` samples (one batched `map` call each; at most `max_open_rows` partly filled rows stay
  open, the fullest is closed when the cap is hit). A sample is never split across rows.
- `mode="bucket"`: one sample per row, padded, in input order.
- A sample longer than `seq_len`: `long_sample="truncate"` (default) keeps its first `seq_len`
  tokens; `"split"` cuts it into `seq_len` chunks, each an independent document (positions restart)
  because the target would see each chunk without its prefix anyway.
- A (truncated or split) sample with no supervised token after its first is dropped: it would cost
  a target forward pass and contribute no loss.
- With a `report`, samples longer than `seq_len` are counted (`truncated` / `split`), and long
  samples dropped by the rule above as skipped for length (`DataReport.skip_for_length`, with the
  shortest seq_len that keeps each: its first supervised token after the first), before packing.
  They are good rows, not bad ones: a longer `seq_len` keeps them.
  Not done: keeping such a row by cutting its context from the left or starting at a later turn.
  The target would then see a conversation without its beginning (system prompt, first turns,
  BOS), which no served request looks like; a longer `seq_len` is the right fix.

Output row contract (all `[seq_len]`):
- `input_ids` int32, padding = `pad_token_id`.
- `loss_mask` bool: the rendered mask, except that the FIRST token of every document is False (it
  has no in-document predecessor, so it is never a prediction target). This makes the trainer's
  anchor rule `loss_mask[p] & loss_mask[p+1]` plus the cumprod over the block stop at document
  boundaries by construction: no label ever comes from the next document. Padding is False.
- `position_ids` int32: 0.. per document, restarting at each document and for the padding tail.
- `doc_ids` int32: 0, 1, .. per document in the row; -1 on padding. Restrict attention to equal ids.
"""

import datasets
import numpy as np
import pyarrow.compute as pc
from datasets import Features, List, Value

MODES = ("pack", "bucket")
LONG_SAMPLE = ("truncate", "split")


def row_features(seq_len: int) -> Features:
    fixed = lambda dtype: List(Value(dtype), length=seq_len)
    return Features(
        {
            "input_ids": fixed("int32"),
            "loss_mask": fixed("bool"),
            "position_ids": fixed("int32"),
            "doc_ids": fixed("int32"),
        }
    )


def _pieces(ids, mask, seq_len: int, long_sample: str):
    if len(ids) <= seq_len:
        return [(ids, mask)]
    if long_sample == "truncate":
        return [(ids[:seq_len], mask[:seq_len])]
    return [(ids[s : s + seq_len], mask[s : s + seq_len]) for s in range(0, len(ids), seq_len)]


def _first_fit(lengths: list[int], seq_len: int, max_open: int) -> list[list[int]]:
    """Group piece indices into rows of total length <= seq_len. Deterministic."""
    closed, open_rows = [], []  # open_rows: [free_space, [piece indices]], in opening order
    for i, n in enumerate(lengths):
        r = next((r for r, row in enumerate(open_rows) if row[0] >= n), None)
        if r is None:
            r = len(open_rows)
            open_rows.append([seq_len, []])
        open_rows[r][0] -= n
        open_rows[r][1].append(i)
        if open_rows[r][0] == 0:  # full: stop scanning it
            closed.append(open_rows.pop(r)[1])
        elif len(open_rows) > max_open:
            fullest = min(range(len(open_rows)), key=lambda r: open_rows[r][0])
            closed.append(open_rows.pop(fullest)[1])
    return closed + [row[1] for row in open_rows]


def _emit(pieces, groups, seq_len: int, pad_token_id: int) -> dict:
    n = len(groups)
    out = {
        "input_ids": np.full((n, seq_len), pad_token_id, dtype=np.int32),
        "loss_mask": np.zeros((n, seq_len), dtype=bool),
        "position_ids": np.zeros((n, seq_len), dtype=np.int32),
        "doc_ids": np.full((n, seq_len), -1, dtype=np.int32),
    }
    for r, group in enumerate(groups):
        at = 0
        for d, p in enumerate(group):
            ids, mask = pieces[p]
            end = at + len(ids)
            out["input_ids"][r, at:end] = ids
            out["loss_mask"][r, at:end] = mask
            out["loss_mask"][r, at] = False  # document start: never a target (see module doc)
            out["position_ids"][r, at:end] = np.arange(len(ids))
            out["doc_ids"][r, at:end] = d
            at = end
        out["position_ids"][r, at:] = np.arange(seq_len - at)
    return out


def _pack_batch(batch, seq_len, mode, long_sample, pad_token_id, max_open) -> dict:
    pieces = []
    for ids, mask in zip(batch["input_ids"], batch["loss_mask"]):
        pieces += [p for p in _pieces(ids, mask, seq_len, long_sample) if any(p[1][1:])]
    if mode == "bucket":
        groups = [[i] for i in range(len(pieces))]
    else:
        groups = _first_fit([len(p[0]) for p in pieces], seq_len, max_open)
    return _emit(pieces, groups, seq_len, pad_token_id)


def count_long_samples(samples: datasets.Dataset, seq_len: int, long_sample: str, report) -> None:
    """Count samples longer than `seq_len` into `report` (see module doc); one arrow pass."""
    ds = samples.with_format("arrow", columns=["input_ids", "loss_mask"])
    for batch in ds.iter(4096):
        lengths = pc.list_value_length(batch["input_ids"]).to_numpy()
        for j in np.flatnonzero(lengths > seq_len):
            mask = batch["loss_mask"][int(j)].as_py()
            pieces = _pieces(mask, mask, seq_len, long_sample)
            if any(any(p[1][1:]) for p in pieces):
                report.note(long_sample if long_sample == "split" else "truncated")
            elif (first := first_target(mask)) is not None:
                report.skip_for_length(seq_len, keeps_at=first + 1)
            else:
                report.drop("no_supervised_tokens", f"a sample of {len(mask)} tokens")


def first_target(mask) -> int | None:
    """Index of the first supervised token after a sample's first (which is never a target)."""
    return next((i for i in range(1, len(mask)) if mask[i]), None)


def pack_samples(
    samples: datasets.Dataset,
    seq_len: int,
    *,
    pad_token_id: int,
    mode: str = "pack",
    seed: int = 0,
    long_sample: str = "truncate",
    window: int = 1000,
    max_open_rows: int = 64,
    report=None,
) -> datasets.Dataset:
    """Samples (`input_ids`, `loss_mask` lists) -> Dataset of `[seq_len]` rows (see module doc)."""
    if mode not in MODES:
        raise ValueError(f"data.packing must be one of {MODES}, got {mode!r}")
    if long_sample not in LONG_SAMPLE:
        raise ValueError(f"data.long_sample must be one of {LONG_SAMPLE}, got {long_sample!r}")
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    if report is not None:
        count_long_samples(samples, seq_len, long_sample, report)
    if mode == "pack":
        samples = samples.shuffle(seed=seed)
    return samples.map(
        _pack_batch,
        batched=True,
        batch_size=window,
        fn_kwargs={
            "seq_len": seq_len,
            "mode": mode,
            "long_sample": long_sample,
            "pad_token_id": pad_token_id,
            "max_open": max_open_rows,
        },
        remove_columns=samples.column_names,
        features=row_features(seq_len),
        desc=f"{mode} to {seq_len}",
    )
