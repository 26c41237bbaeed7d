"""Runs that read the same batches in the same order (same data, seed and batch size), compared on
them: the mean training-batch analytic tau of each run over windows of steps, and each over the
first run's. Each step's tau is taken on its batch before the step's update, so over the first
pass, while no row has been seen, it is a held-out figure; later it mixes in rows already read.

    python lab/analysis/train_tau_windows.py NAME=METRICS.jsonl ... --windows 1-100 101-200 201-297
        [--heldout 500 ...]   # also the held-out evaluation at those steps (analytic and greedy)

METRICS.jsonl: a run's metrics file (train.distill writes OUTPUT_DIR/metrics.jsonl).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_metrics(path: Path) -> tuple[dict[int, float], dict[int, dict]]:
    """({step: analytic tau of that step's training batch}, {step: that step's held-out
    evaluation row}, train.distill's eval_every) from one read of the file."""
    train, heldout = {}, {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("split") == "train" and "analytic_tau" in row:
            train[row["step"]] = row["analytic_tau"]
        elif row.get("split") == "eval":
            heldout[row["step"]] = row
    return train, heldout


def window_means(taus: dict[int, float], lo: int, hi: int) -> float | None:
    got = [taus[s] for s in range(lo, hi + 1) if s in taus]
    return sum(got) / len(got) if got else None


def parse_window(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    if not sep or not lo.isdigit() or not hi.isdigit() or int(lo) > int(hi):
        raise argparse.ArgumentTypeError(f"a window is FIRST-LAST steps, got {text!r}")
    return int(lo), int(hi)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="NAME=METRICS.jsonl; the first is the baseline")
    ap.add_argument("--windows", nargs="+", type=parse_window, required=True)
    ap.add_argument("--heldout", nargs="+", type=int, default=[], metavar="STEP")
    a = ap.parse_args(argv)
    runs, evals = {}, {}
    for spec in a.runs:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"runs are NAME=METRICS.jsonl with an existing file; got {spec!r}")
        runs[name], evals[name] = read_metrics(Path(path))
    names = list(runs)
    print(
        "| steps | "
        + " | ".join(names)
        + " | "
        + " | ".join(f"{n} / {names[0]}" for n in names[1:])
        + " |"
    )
    print("|---|" + "---|" * (2 * len(names) - 1))
    rows = [(f"{lo}-{hi}", [window_means(runs[n], lo, hi) for n in names]) for lo, hi in a.windows]
    for step in a.heldout:
        for key, label in (("analytic_tau", "analytic"), ("greedy_tau", "greedy")):
            got = [evals[n].get(step, {}).get(key) for n in names]
            rows.append((f"held out at {step}, {label}", got))
    for label, values in rows:
        cells = [f"{m:.3f}" if m is not None else "-" for m in values]
        ratios = [
            f"{m / values[0]:.3f}" if m is not None and values[0] else "-" for m in values[1:]
        ]
        print(f"| {label} | " + " | ".join(cells + ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
