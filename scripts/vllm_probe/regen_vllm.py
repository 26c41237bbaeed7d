"""Run the pipeline's response regeneration with backend="vllm" (real `vllm.LLM`) in its own
process, for tests/vllm/test_regenerate.py.

    python scripts/vllm_probe/regen_vllm.py MODEL_DIR ROWS_JSON OUT_JSONL [--max-new-tokens N]

A separate process because `vllm.LLM` starts an engine core (multiprocessing, its own
distributed state) that must not meet the in-process vLLM modules the other tests build; the
`__main__` guard is what vLLM's spawned workers need. Prints `regen_vllm: dtype=...`, the dtype
the engine resolved. Exit code 0 on success.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("rows")
    ap.add_argument("out")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args(argv)

    from train.data import regen_backends
    from train.data.regenerate import regenerate_responses

    # Report the dtype the engine really runs in (vLLM resolves dtype="auto" itself).
    init = regen_backends.VLLMGenerator.__init__

    def init_and_report(self, *a, **kw):
        init(self, *a, **kw)
        print(f"regen_vllm: dtype={self.llm.llm_engine.model_config.dtype}", flush=True)

    regen_backends.VLLMGenerator.__init__ = init_and_report

    rows = json.loads(Path(args.rows).read_text())
    n = regenerate_responses(
        rows,
        args.model,
        args.model,
        {"temperature": 0.0, "max_new_tokens": args.max_new_tokens},
        args.out,
        batch_size=args.batch_size,
        backend="vllm",
    )
    print(f"regen_vllm: wrote {n} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
