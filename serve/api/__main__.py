"""`python -m serve.api --target DIR [--checkpoint DIR] --port N`: a thin entry for tests and
local runs (production launches go through `serve.launch`). Exit code 2 for bad options.

`--tp N` (batch-sharded sampling over N ranks, outputs identical to one process) runs under
`torchrun --nproc-per-node N -m serve.api ... --tp N`: rank 0 serves HTTP, the others follow it.
"""

from __future__ import annotations

import argparse
import sys

from serve.api.server import run_server
from serve.engine.options import (
    ADAPTIVE_POLICIES,
    BUDGET_CONFIDENCES,
    DRAFT_SAMPLING,
    EngineOptions,
    OptionsError,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve.api", description=__doc__)
    ap.add_argument("--target", required=True, help="HF model folder of the target")
    ap.add_argument("--checkpoint", default=None, help="DSpark draft folder (omit: target-only)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-speculative-tokens", type=int, default=None)
    ap.add_argument("--draft-sampling", default="probabilistic", choices=DRAFT_SAMPLING)
    ap.add_argument("--adaptive-verification", action="store_true")
    ap.add_argument(
        "--adaptive-policy",
        default="vllm",
        choices=ADAPTIVE_POLICIES,
        help="vllm: vLLM 0.34's batch draft budget; algorithm1: the paper's admission",
    )
    ap.add_argument(
        "--adaptive-budget-confidence",
        default="current",
        choices=BUDGET_CONFIDENCES,
        help="vllm policy: the confidences that pick the draft budget: this round's (current) or "
        "each request's previous round's, vLLM 0.34's lag (previous)",
    )
    ap.add_argument("--cost-table", default=None, help="vllm policy: a saved PaddedCostTable")
    ap.add_argument("--sps-table", default=None, help="algorithm1 only: steps/s by token count")
    ap.add_argument(
        "--use-fp64-gumbel", action="store_true", help="float64 Gumbel noise (vLLM's flag)"
    )
    ap.add_argument(
        "--tp",
        type=int,
        default=1,
        help="ranks sharing the sampling; > 1 needs torchrun --nproc-per-node N (or a world of N)",
    )
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument(
        "--max-queued",
        type=int,
        default=256,
        help="requests waiting for a slot beyond --max-num-seqs; more are answered 429",
    )
    a = ap.parse_args(argv)
    try:
        opts = EngineOptions(
            target=a.target,
            checkpoint=a.checkpoint,
            device=a.device,
            dtype=a.dtype,
            num_speculative_tokens=a.num_speculative_tokens,
            draft_sampling=a.draft_sampling,
            adaptive_verification=a.adaptive_verification,
            adaptive_policy=a.adaptive_policy,
            adaptive_budget_confidence=a.adaptive_budget_confidence,
            cost_table=a.cost_table,
            sps_table=a.sps_table,
            use_fp64_gumbel=a.use_fp64_gumbel,
            tp=a.tp,
            max_num_seqs=a.max_num_seqs,
            max_model_len=a.max_model_len,
            seed=a.seed,
        )
        if a.max_queued < 0:
            raise OptionsError(f"--max-queued={a.max_queued}: must be >= 0")
        run_server(opts, a.host, a.port, a.served_model_name, max_queued=a.max_queued)
    except OptionsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
