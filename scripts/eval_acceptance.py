"""Former entry point of the acceptance evaluation, kept as a thin caller of `serve.evaluate` (the
product command) for the scripts and documents that still call it with the old flags.

    python scripts/eval_acceptance.py --target artifacts/tiny-target \
        --draft dspark=outputs/tiny/final --draft dflash=outputs/tiny_dflash/final \
        --temperatures 0 1 --num-prompts 24 --max-tokens 64 --json OUT.json

Old flags map to serve.evaluate's: --num-prompts -> --max-prompts, --max-tokens ->
--max-new-tokens; --json OUT.json writes the list of rows (the old format, which
scripts/paired_interval.py and the plotting scripts read) beside serve.evaluate's
OUT.json.d/eval.json. The helpers below are re-exported for the scripts that import them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.atomic_file import write_whole  # noqa: E402
from serve import evaluate as ev  # noqa: E402
from serve.evaluate import evaluate, read_jsonl, shown_conditional  # noqa: E402, F401


def heldout_prompts(target, tokenizer, n, files=None, max_tokens=10**9):
    """{domain: up to n prompts' ids} (serve.evaluate.load_prompts); the skipped counts are on
    `heldout_prompts.skipped`."""
    prompts, heldout_prompts.skipped = ev.load_prompts(target, tokenizer, n, files, max_tokens)
    return prompts


def add_runtime_args(ap) -> None:
    """--device, --dtype, --threads and --json, shared by the acceptance scripts."""
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json")


def parse_runtime_args(ap, argv):
    """Parse, and apply --threads."""
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    return a


def parse_prompt_files(specs: list[str] | None) -> dict[str, str] | None:
    try:
        return ev.parse_pairs(specs, "--prompts", "file") or None
    except ev.BadInput as e:
        raise SystemExit(str(e)) from e


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="artifacts/tiny-target")
    ap.add_argument("--draft", action="append", required=True, help="NAME=CHECKPOINT_DIR")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--prompts", nargs="+", help="NAME=FILE: a domain's chat rows (.jsonl[.gz])")
    ap.add_argument("--num-prompts", type=int, default=24, help="per domain")
    ap.add_argument("--max-prompt-tokens", type=int, default=768)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="engine max_num_seqs")
    ap.add_argument("--num-spec", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    add_runtime_args(ap)
    a = ap.parse_args(argv)
    out = str(Path(a.json).with_suffix(".json.d")) if a.json else "eval_acceptance.out"
    new = ["--target", a.target, "--out", out, "--temperatures", *map(str, a.temperatures)]
    new += ["--max-prompts", str(a.num_prompts), "--max-new-tokens", str(a.max_tokens)]
    new += ["--max-prompt-tokens", str(a.max_prompt_tokens), "--batch", str(a.batch)]
    new += ["--seed", str(a.seed), "--device", a.device, "--dtype", a.dtype]
    new += [x for d in a.draft for x in ("--draft", d)]
    new += ["--prompts", *a.prompts] if a.prompts else []
    new += ["--num-spec", str(a.num_spec)] if a.num_spec else []
    new += ["--threads", str(a.threads)] if a.threads else []
    rc = ev.main(new)
    if rc == 0 and a.json:
        rows = json.loads((Path(out) / "eval.json").read_text())["rows"]
        write_whole(a.json, json.dumps(rows, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
