"""train/data/disjoint.py against an independent naive double loop over every pair of rows."""

from __future__ import annotations

import random
import unicodedata

from train.data.disjoint import disjoint_splits, normalise


def _naive_same(a: str, b: str) -> bool:
    """Reference equality: NFKC, casefold, split on whitespace and rejoin (written apart)."""
    fa = " ".join(unicodedata.normalize("NFKC", a).casefold().split())
    fb = " ".join(unicodedata.normalize("NFKC", b).casefold().split())
    return fa == fb


def _users(row):
    return [m["content"] for m in row["messages"] if m["role"] == "user"]


def _clashes(a, b) -> bool:
    return any(_naive_same(x, y) for x in _users(a) for y in _users(b))


def _naive(train, candidates):
    kept = {}
    earlier = list(train)
    for split, rows in candidates.items():
        kept[split] = []
        for row in rows:
            if any(_clashes(row, other) for other in earlier + kept[split]):
                continue
            kept[split].append(row)
        earlier += kept[split]
    return kept


WORDS = ["Sort", "sort", "a list", "A  LIST", "\tthe\u00a0list", "ﬁle", "file", "ß", "ss", "x"]


def _row(rng, i, assistant=True):
    msgs = []
    for _ in range(rng.choice([1, 1, 2])):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 2)))
        msgs.append({"role": "user", "content": rng.choice(["", " ", "\n"]) + text})
        if assistant:
            msgs.append({"role": "assistant", "content": rng.choice(WORDS)})
    return {"id": f"r{i}", "messages": msgs}


def test_matches_the_naive_double_loop_on_random_rows():
    rng = random.Random(0)
    for trial in range(30):
        train = [_row(rng, i) for i in range(rng.randint(0, 6))]
        cands = {
            s: [_row(rng, i, False) for i in range(rng.randint(0, 12))] for s in ("dev", "test")
        }
        kept, report = disjoint_splits(train, cands)
        assert kept == _naive(train, cands), trial
        for split in cands:
            dropped = sum(report[split]["dropped"].values())
            assert report[split]["kept"] + dropped == len(cands[split])


def test_normalisation_and_drop_reasons():
    assert normalise("  Sort\u00a0A\n\tLIST ") == "sort a list"
    assert normalise("ﬁle") == "file" and normalise("Straße") == normalise("STRASSE")
    assert normalise("sort a list.") != normalise("sort a list")
    train = [
        {
            "messages": [
                {"role": "user", "content": "Hello  World"},
                {"role": "assistant", "content": "hi"},
            ]
        }
    ]
    dev = [
        {"messages": [{"role": "user", "content": "hello world"}]},
        {"messages": [{"role": "user", "content": "q"}]},
    ]
    test = [
        {"messages": [{"role": "user", "content": "Q"}]},
        {"messages": [{"role": "user", "content": "new"}]},
        {"messages": [{"role": "user", "content": "NEW "}]},
    ]
    kept, report = disjoint_splits(train, {"dev": dev, "test": test})
    assert [r["messages"][0]["content"] for r in kept["dev"]] == ["q"]
    assert [r["messages"][0]["content"] for r in kept["test"]] == ["new"]
    assert report["dev"]["dropped"] == {"overlaps_train": 1}
    assert report["test"]["dropped"] == {"overlaps_dev": 1, "duplicate": 1}
