"""`python -m train.prepare.data NAME --out DIR [options]`: a packaged dataset's splits as JSONL.

    python -m train.prepare.data sharegpt --out data/ --turns first --seed 0 --gzip
    python -m train.prepare.data humaneval --out data/
    python -m train.prepare.data pystdlib --out data/ [--seed 0] [--max-rows N]
    python -m train.prepare.data pypackages --out data/ [--packages NAME...] [--per-package N]

pystdlib: HumanEval-style code prompts from this Python's standard library, a train split
(train/data/pystdlib.py); pypackages: the same from installed packages (train/data/pypackages.py:
a default list of pure-Python libraries, at most 1,500 prompts a package). Writes
DIR/NAME-SPLIT.jsonl (.jsonl.gz with --gzip; `load_rows` reads both) and DIR/NAME-report.json,
and prints how many conversations were kept and dropped, and why.
The same build of sharegpt and humaneval backs the `data.train=sharegpt:train` style sources
(train/data/packaged.py), cached there.
Exit code 2 when the source file cannot be found or read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from train.data.packaged import SOURCES, split_file, write_prepared, write_splits
from train.data.sharegpt import TURNS
from train.publish.package_files import PackageFileError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train.prepare.data", description=__doc__.split("\n")[0]
    )
    p.add_argument("name", choices=sorted([*SOURCES, *CODE_SOURCES]))
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--file", help="read this file instead of the package's")
    p.add_argument(
        "--turns",
        choices=TURNS,
        help="sharegpt: one row of all turns, of the first, one row per answered turn, or those "
        "rows after the first (train/data/sharegpt.py)",
    )
    p.add_argument(
        "--seed", type=int, help="sharegpt: split seed; pystdlib, pypackages: shuffle (default 0)"
    )
    p.add_argument("--max-rows", type=int, help="pystdlib, pypackages: at most this many prompts")
    p.add_argument("--packages", nargs="+", help="pypackages: these, in this order")
    p.add_argument("--per-package", type=int, help="pypackages: at most this many a package")
    p.add_argument("--heldout-fraction", type=float, help="sharegpt: default 0.02")
    p.add_argument("--gzip", action="store_true", help="write .jsonl.gz")
    a = p.parse_args(argv)
    start = time.perf_counter()
    if a.name in CODE_SOURCES:
        return prepare_code(p, a, start)
    for flag in ("max_rows", "packages", "per_package"):
        if getattr(a, flag) is not None:
            p.error(f"--{flag.replace('_', '-')} does not apply to {a.name}")
    opts = dict(SOURCES[a.name].options)
    given = {"turns": a.turns, "seed": a.seed, "heldout_fraction": a.heldout_fraction}
    for key, value in given.items():
        if value is None:
            continue
        if key not in opts:
            p.error(f"--{key.replace('_', '-')} does not apply to {a.name}")
        opts[key] = value
    try:
        report = write_prepared(a.name, opts, Path(a.out), file=a.file, gz=a.gzip)
    except (PackageFileError, OSError, ValueError) as e:
        print(f"[prepare-data] error: {e}", file=sys.stderr)
        return 2
    return done(report, a, start)


CODE_SOURCES = ("pypackages", "pystdlib")


def prepare_code(p: argparse.ArgumentParser, a, start: float) -> int:
    """pystdlib or pypackages: HumanEval-form code prompts as a train split."""
    from train.data.pypackages import DEFAULT_PACKAGES, PER_PACKAGE, pypackages_rows
    from train.data.pystdlib import pystdlib_rows

    wrong = ["file", "turns", "heldout_fraction"]
    wrong += ["packages", "per_package"] if a.name == "pystdlib" else []
    for flag in wrong:
        if getattr(a, flag) is not None:
            p.error(f"--{flag.replace('_', '-')} does not apply to {a.name}")
    for flag in ("max_rows", "per_package"):
        if getattr(a, flag) is not None and getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(a, flag)}")
    try:
        if a.name == "pystdlib":
            rows, report = pystdlib_rows(seed=a.seed or 0, max_rows=a.max_rows)
        else:
            names, cap = a.packages or DEFAULT_PACKAGES, a.per_package or PER_PACKAGE
            rows, report = pypackages_rows(names, a.seed or 0, a.max_rows, cap)
        write_splits(a.name, {"train": rows}, report, Path(a.out), a.gzip)
    except (OSError, ValueError) as e:
        print(f"[prepare-data] error: {e}", file=sys.stderr)
        return 2
    return done(report, a, start)


def done(report: dict, a, start: float) -> int:
    print(json.dumps(report, indent=2))
    for split, n in report["splits"].items():
        print(f"[prepare-data] {split_file(Path(a.out), a.name, split, a.gzip)}: {n} rows")
    print(f"[prepare-data] {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
