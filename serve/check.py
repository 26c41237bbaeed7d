"""`python -m serve.check CKPT_DIR [--vllm] [--target PATH]`: validate a DSpark checkpoint against
the vLLM contract and, with `--target`, against the target it will be served with (hidden size,
vocab, layer ids, mask token, block layout, tokenizer: `common.target_fit`); prints one line per
problem and exits 1 if there is any (0 when clean). A clean checkpoint also gets the
`--speculative-config` that `serve.launch` would pass vLLM for it. A file that cannot be read (a
truncated model.safetensors, a config.json that is not JSON, an incomplete target folder) is one
such line too (`common.checkpoint_errors.CheckpointFileError`), never a traceback."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from common.checkpoint import read_config
from common.checkpoint_errors import CheckpointFileError, check_model_folder
from common.contract import check_checkpoint
from common.spec_config import speculative_config
from common.target_fit import checkpoint_fit_problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve.check", description=__doc__)
    ap.add_argument("ckpt_dir")
    ap.add_argument(
        "--vllm", action="store_true", help="also require what stock vLLM can serve (vanilla head)"
    )
    ap.add_argument(
        "--target", default=None, help="local target folder the draft will be served with"
    )
    args = ap.parse_args(argv)
    try:
        problems = _problems(args)
        if not problems:
            spec = speculative_config(read_config(args.ckpt_dir), args.ckpt_dir)
    except CheckpointFileError as e:
        problems = [str(e)]
    for p in problems:
        print(f"{args.ckpt_dir}: {p}")
    if not problems:
        print(f"{args.ckpt_dir}: OK" + (f" for target {args.target}" if args.target else ""))
        print(f"vLLM: --speculative-config {shlex.quote(json.dumps(spec))}")
    return 1 if problems else 0


def _problems(args) -> list[str]:
    problems = check_checkpoint(args.ckpt_dir, require_vllm_servable=args.vllm)
    if args.target is not None and not problems:
        if Path(args.target).is_dir():
            check_model_folder(args.target, "target")
        problems = [f"target fit: {p}" for p in checkpoint_fit_problems(args.ckpt_dir, args.target)]
    return problems


if __name__ == "__main__":
    sys.exit(main())
