"""`python -m serve.check CKPT_DIR [--vllm]`: validate a DSpark checkpoint against the vLLM
contract; prints one line per problem and exits 1 if there is any (0 when clean). A clean
checkpoint also gets the `--speculative-config` that `serve.launch` would pass vLLM for it."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from common.checkpoint import read_config
from common.contract import check_checkpoint
from common.spec_config import speculative_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve.check", description=__doc__)
    ap.add_argument("ckpt_dir")
    ap.add_argument(
        "--vllm", action="store_true", help="also require what stock vLLM can serve (vanilla head)"
    )
    args = ap.parse_args(argv)
    problems = check_checkpoint(args.ckpt_dir, require_vllm_servable=args.vllm)
    for p in problems:
        print(f"{args.ckpt_dir}: {p}")
    if not problems:
        print(f"{args.ckpt_dir}: OK")
        spec = speculative_config(read_config(args.ckpt_dir), args.ckpt_dir)
        print(f"vLLM: --speculative-config {shlex.quote(json.dumps(spec))}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
