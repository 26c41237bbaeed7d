"""Evaluation prompts disjoint from training by content, not only by id.

ShareGPT repeats conversations under different ids (11 of 96 held-out prompts once had an identical
user turn among the training rows), so a split by id alone lets the evaluation measure memorised
prompts. Here a row's identity is the set of its user turns' normalised texts (`normalise`):
Unicode NFKC (full-width letters, ligatures and non-breaking spaces become their plain forms),
case-folded (`str.casefold`, a stronger lowercase: "ß" == "ss"), every run of whitespace one
space, stripped at both ends. Punctuation and everything else is kept: two prompts that differ in
a word are different prompts.

`disjoint_splits(train, candidates)` keeps, split after split in the order given (dev before test),
each candidate row none of whose normalised user turns is a user turn of a training row, of an
earlier split's kept row, or of a row kept before it in the same split (a repeat). So no dev or
test prompt equals a training user turn, test never repeats dev, and no split repeats itself;
the report counts what was dropped for each reason. Training rows are never dropped.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

_WHITESPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """The comparison form of a user turn (see the module docstring)."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def user_turns(row: dict) -> set[str]:
    """The normalised texts of `row`'s user turns."""
    return {normalise(m["content"]) for m in row["messages"] if m.get("role") == "user"}


def disjoint_splits(
    train: Iterable[dict], candidates: dict[str, list[dict]]
) -> tuple[dict[str, list[dict]], dict]:
    """-> (kept rows per split in the order of `candidates`, report). See the module docstring."""
    seen: set[str] = set()
    for row in train:
        seen |= user_turns(row)
    n_train_turns = len(seen)
    owner = dict.fromkeys(seen, "train")  # turn -> the split that holds it first
    kept: dict[str, list[dict]] = {}
    order = ["train", *candidates]
    report: dict = {"normalisation": "NFKC, casefold, whitespace runs -> one space, strip"}
    report["train_user_turns"] = n_train_turns
    for split, rows in candidates.items():
        kept[split], dropped = [], {}
        for row in rows:
            turns = user_turns(row)
            holders = {owner[t] for t in turns if t in owner}
            if holders:
                # named after the earliest holder: train, then the splits in order, then a repeat
                first = next(s for s in order if s in holders)
                reason = "duplicate" if first == split else f"overlaps_{first}"
                dropped[reason] = dropped.get(reason, 0) + 1
                continue
            kept[split].append(row)
            owner.update(dict.fromkeys(turns, split))
        report[split] = {"candidates": len(rows), "kept": len(kept[split]), "dropped": dropped}
    return kept, report
