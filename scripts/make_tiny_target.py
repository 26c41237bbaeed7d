"""Build the project's embedded default target: a tiny Qwen3 chat LM trained here, offline.

    python scripts/make_tiny_target.py                       # tiny, 3 min on CPU
    python scripts/make_tiny_target.py --steps 200           # reproducible step budget
    python scripts/make_tiny_target.py --preset small --device cuda   # H200: stops at 8 passes

Output: an HF folder (model + tokenizer with a generation-tagged ChatML template + data/*.jsonl +
train_summary.json + recipe.json), reused when its recipe hash matches. The logic lives in
`train/tiny_target/` (a package module, so `train` can build the target without `scripts/`);
this file is its command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# Idle OpenMP threads sleep instead of spinning: on a shared 2-core box spinning workers steal the
# cores the busy ones need (measured 3-7x slower steps under load). Read when torch loads, so it
# must be set before the imports below; an explicit user setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from train.tiny_target.build import (  # noqa: E402
    DEFAULT_OUT,
    TinyTargetBuild,
    build_tiny_target,
)
from train.tiny_target.presets import PRESETS  # noqa: E402

__all__ = ["DEFAULT_OUT", "TinyTargetBuild", "build_tiny_target", "main"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, help="training wall-clock budget (preset default)")
    budget.add_argument("--steps", type=int, help="optimizer steps (deterministic on one device)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-files", type=int, help="cap code files / prose docs (0: no cap)")
    ap.add_argument("--vocab-size", type=int, help="BPE vocab incl. specials (preset: 4096)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    ap.add_argument(
        "--dtype",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="autocast dtype; auto = bf16 on CUDA and on CPUs with native bf16",
    )
    ap.add_argument("--compile", action="store_true", help="torch.compile the training forward")
    ap.add_argument("--threads", type=int, help="CPU torch threads (default: os.cpu_count())")
    ap.add_argument("--force", action="store_true", help="rebuild even if the recipe matches")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        build = build_tiny_target(
            args.out,
            preset=args.preset,
            minutes=args.minutes,
            steps=args.steps,
            seed=args.seed,
            max_files=args.max_files,
            device=args.device,
            vocab_size=args.vocab_size,
            dtype=args.dtype,
            compile_model=args.compile,
            threads=args.threads,
            force=args.force,
        )
    except ValueError as e:
        print(f"make_tiny_target: {e}", file=sys.stderr)
        return 2
    s = build.summary
    print(f"{build.path}: held-out loss {s['heldout_loss']:.3f} (uniform {s['uniform_loss']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
