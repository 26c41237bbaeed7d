"""`data.heldout=auto` (the default): the target's own held-out file, else a share of data.train.

`auto` reads `TARGET/data/heldout.jsonl`, which the tiny target ships and a real HF model folder
does not. When it is absent, a fixed share of `data.train` is held out instead (a held-out path
given explicitly must exist; `null` means no held-out evaluation):
- a row is held out iff sha256 of its JSON (keys sorted) read as a fraction of 2**64 is below
  `HELDOUT_FRACTION` (2%). A property of the row alone: the same split on every rank, on resume and
  whatever rows surround it; identical rows land on the same side;
- training never sees a held-out row; the evaluation reads at most `data.heldout_max_rows` of them,
  in file order;
- when either side would be empty (a file of a few dozen rows), nothing is carved: every row trains
  and the run has no held-out evaluation (its metrics are the last training step's).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets

AUTO = "auto"
HELDOUT_FRACTION = 0.02


def target_heldout_path(target_path: str) -> Path:
    """Where `data.heldout=auto` looks first."""
    return Path(target_path) / "data" / "heldout.jsonl"


def is_carved_heldout(row: dict) -> bool:
    text = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < HELDOUT_FRACTION


def carve_heldout(
    rows: datasets.Dataset, max_heldout: int | None = None
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """-> (training rows, held-out rows or None), see the module doc."""
    held = [i for i, row in enumerate(rows) if is_carved_heldout(row)]
    if not held or len(held) == len(rows):
        return rows, None
    chosen = set(held)
    train = rows.select([i for i in range(len(rows)) if i not in chosen])
    return train, rows.select(held[:max_heldout] if max_heldout else held)
