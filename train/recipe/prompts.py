"""The recipe's `prompts` stage: training prompts, and dev and test prompts disjoint from them.

    OUT/prompts/train.jsonl       chat + code prompts the target answers (regenerate), shuffled
    OUT/prompts/dev.chat.jsonl    for choosing drafts
    OUT/prompts/dev.code.jsonl
    OUT/prompts/test.chat.jsonl   only for the figures a model card claims
    OUT/prompts/test.code.jsonl
    OUT/prompts/report.json       sources, Python and package versions, counts, overlap drops

Chat: ShareGPT (train/data/packaged.py), first turn of each conversation; train rows from its
train split, dev and test from its held-out split (by conversation id, `heldout_fraction`),
shuffled with the seed and taken in turn. Code: HumanEval's 164 tasks go to test (first); the
rest of test, and dev, are prompts from installed packages named only for them (`dev_packages`,
`test_packages`), and training reads the standard library and `train_packages`, so train, dev
and test never share a package. Then `train.data.disjoint` drops every dev or test row whose
normalised user turn equals a training row's (or dev's, for test), before the row caps.
Every row keeps the conversation up to its first user turn (no answer: the target writes it).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from train.data.disjoint import disjoint_splits
from train.data.packaged import build_splits, write_jsonl

SPLIT_FILES = ("train", "dev.chat", "dev.code", "test.chat", "test.code")


def _prompt_only(row: dict) -> dict:
    """The row up to and including its first user turn (a system turn before it is kept)."""
    msgs = row["messages"]
    first = next(i for i, m in enumerate(msgs) if m["role"] == "user")
    return {"id": row["id"], "messages": msgs[: first + 1]}


def _chat(c) -> tuple[list[dict], list[dict], dict]:
    opts = {"turns": "first", "seed": c.seed, "heldout_fraction": c.heldout_fraction}
    splits, report = build_splits("sharegpt", opts, c.file, progress=False)
    rng = random.Random(f"chat/{c.seed}")
    # answers are dropped: regenerate writes the target's own (and the file stays small)
    train = [_prompt_only(r) for r in splits["train"]]
    held = [_prompt_only(r) for r in splits["heldout"]]
    rng.shuffle(train)
    rng.shuffle(held)
    return train[: c.train_rows], held, report


def _code(c) -> tuple[list[dict], list[dict], list[dict], dict]:
    from train.data.humaneval import humaneval_rows
    from train.data.packaged import SOURCES
    from train.data.pypackages import pypackages_rows
    from train.data.pystdlib import pystdlib_rows
    from train.publish.package_files import find_package_file

    report: dict = {}
    train: list[dict] = []
    if c.train_stdlib:
        rows, report["stdlib"] = pystdlib_rows(seed=c.seed)
        train += rows
    for side in ("train", "dev", "test"):
        names = list(getattr(c, f"{side}_packages"))
        if names:
            rows, report[f"{side}_packages"] = pypackages_rows(names, c.seed, None, c.per_package)
        else:
            rows = []
        if side == "train":
            train += rows
        elif side == "dev":
            dev = rows
        else:
            test = rows
    random.Random(f"code/{c.seed}").shuffle(train)
    src = SOURCES["humaneval"]
    found = find_package_file(src.package, src.version, src.member, explicit=c.humaneval_file)
    humaneval = humaneval_rows(found.path)
    report["humaneval"] = {"source": found.how, "rows": len(humaneval)}
    return train[: c.train_rows], dev, humaneval + test, report


def build_prompts(cfg, out: Path) -> dict:
    """Write the five files and report.json into `out` (see the module docstring); -> report."""
    chat_train, chat_held, chat_report = _chat(cfg.chat)
    code_train, code_dev, code_test, code_report = _code(cfg.code)
    train = chat_train + code_train
    random.Random(f"train/{cfg.chat.seed}/{cfg.code.seed}").shuffle(train)
    # ShareGPT's held-out rows fill dev first, the rest is test's; both then lose overlaps
    candidates = {
        "dev.chat": chat_held[: len(chat_held) // 2],
        "dev.code": code_dev,
        "test.chat": chat_held[len(chat_held) // 2 :],
        "test.code": code_test,
    }
    kept, overlap = disjoint_splits(train, candidates)
    caps = {
        "dev.chat": cfg.chat.dev_rows,
        "dev.code": cfg.code.dev_rows,
        "test.chat": cfg.chat.test_rows,
        "test.code": cfg.code.test_rows,
    }
    files = {"train": train, **{k: rows[: caps[k]] for k, rows in kept.items()}}
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in files.items():
        write_jsonl(rows, out / f"{split}.jsonl")
    report = {
        "rows": {k: len(v) for k, v in files.items()},
        "train_rows": {"chat": len(chat_train), "code": len(code_train)},
        "caps": caps,
        "overlap": overlap,
        "chat": {k: v for k, v in chat_report.items() if k != "options"}
        | {
            "options": dict(
                turns="first", seed=cfg.chat.seed, heldout_fraction=cfg.chat.heldout_fraction
            )
        },
        "code": code_report,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    short = {k: n for k, n in report["rows"].items() if k != "train" and n < min(caps[k], 200)}
    if short:
        print(f"[recipe] prompts: fewer than 200 (or the cap) rows in {short}: sources too small")
    return report
