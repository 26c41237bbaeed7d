"""Why vLLM 0.34's adaptive verification lost to plain DSpark on SmolLM2: an EMULATION of its
draft budget on the measured per-position acceptance, not a measurement.

    PYTHONPATH=. python lab/analysis/adaptive_smollm2.py [VLLM_SPEEDUP_JSON]

VLLM_SPEEDUP_JSON: default docs/results/vllm034/matched_2026-12-04/vllm_speedup.json.

What is vLLM's code, run here through the repo's copy of it (`common.sampling.draft_budget`,
tested equal to vLLM 0.34's `get_num_tokens` / `assign_draft_token_budget` /
`build_cost_tables_from_curves`):
- the budget: the first argmax over m of (R + sum of the m best survivals) / (draft_cost[R] +
  verify_cost[R + m]);
- the cost table: vLLM profiles it at start-up (`profile_adaptive_verification`) with dummy
  batches of T requests of ONE token each, every request carrying
  VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN (8192, clamped to max_model_len - 1: 2047 in the
  SmolLM2 runs) tokens of KV context, at the varlen CUDA-graph sizes (1, 2, 4, 8, 10, 12, ...).
  So verify_cost[T] grows by one request's KV read per token, while the verify it prices adds
  draft tokens to the SAME R requests, whose KV is read once whatever their query length.

What is assumed (swept): the profile's fixed GPU cost (draft + verify at one token) and its
per-request KV read at 2047 tokens (SmolLM2-135M in bf16: 30 layers x 2 x 3 KV heads x 64 x 2 B =
23 KB a token, 47 MB a request, ~10 us at the H200's 4.8 TB/s); the head's confidences
(calibrated to the measured per-position rates, or shifted by +1 in logit: over-confident, as
this repo's raw heads were on held-out data); the real marginal cost of a verified draft token
(b, bounded by the measured round times). The realised tau of a budget is what the admitted
slots' true survivals give (no discrimination between requests: a lower bound on what a head
that ranks requests could keep).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from common.sampling.draft_budget import (
    allocate_draft_budget,
    build_cost_table,
    choose_draft_budget,
)

RAW = Path("docs/results/vllm034/matched_2026-12-04/vllm_speedup.json")
N = 7  # drafts a round in those runs
PROFILE_CONTEXT = 2047  # min(8192, max_model_len 2048 - query 1)
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2  # SmolLM2-135M, bf16
HBM_BYTES_PER_MS = 4.8e9  # H200, 4.8 TB/s
MAX_NUM_SEQS = 256  # vLLM's default (1024 on >= 70 GB GPUs): either is above c * (N + 1) <= 256


def varlen_grid(max_tokens: int) -> list[int]:
    """vLLM 0.34's `varlen_decode_cudagraph_capture_grid` (not dense_head)."""
    grid, low = {1, 2, 4, 8}, 8
    while low < 1024:
        grid.update(range(low + low // 4, 2 * low + 1, low // 4))
        low *= 2
    grid.update(range(1024, 4096, 128))
    return sorted({s for s in grid if s < max_tokens} | {max_tokens})


def profiled_tables(fixed_ms: float, kv_ms_per_req: float, reqs: int):
    """(draft_cost[R], verify_cost[T]) as vLLM would profile them for a batch of `reqs`: a dummy
    run of T tokens has min(T, max_num_seqs) = T requests of one token here (max_num_seqs is
    vLLM's default 256 or more, above every T priced), each reading `kv_ms_per_req` of context;
    the draft half of `fixed_ms` plus its own KV reads."""
    sizes = [s for s in varlen_grid(MAX_NUM_SEQS * (N + 1)) if s <= MAX_NUM_SEQS]
    draft = [(s, fixed_ms / 2 + kv_ms_per_req * s) for s in sizes]
    verify = [(s, fixed_ms / 2 + kv_ms_per_req * s) for s in sizes]
    cap = sizes[-1]
    return (
        build_cost_table(draft, reqs, cap),
        build_cost_table(verify, reqs * (N + 1), cap),
    )


def emulate_budget(survival: list[float], conf_shift: float, reqs: int, tables) -> dict:
    """vLLM's budget for `reqs` identical requests, and the tau its admitted slots realise."""
    s = np.asarray(survival)
    cond = s / np.concatenate([[1.0], s[:-1]])
    logit = np.log(cond / (1 - cond)) + conf_shift
    conf = torch.tensor(1 / (1 + np.exp(-logit)), dtype=torch.float32).repeat(reqs, 1)
    drafts = torch.full((reqs,), N)
    draft_t, verify_t = tables
    cost = torch.tensor(draft_t[reqs] + verify_t[reqs : reqs + reqs * N + 1])
    m = choose_draft_budget(conf, drafts, cost)
    lengths = allocate_draft_budget(conf, drafts, m)
    cum = np.concatenate([[0.0], np.cumsum(s)])
    tau = 1 + float(np.mean([cum[int(k)] for k in lengths]))
    return {"budget": m, "verified_per_req": m / reqs, "tau": tau}


def main(argv: list[str]) -> int:
    rows = json.loads(Path(argv[0] if argv else RAW).read_text())
    plain = {r["concurrency"]: r for r in rows if r["variant"] == "dspark"}
    adapt = {r["concurrency"]: r for r in rows if r["variant"] == "dspark_adaptive"}
    kv_ms = KV_BYTES_PER_TOKEN * PROFILE_CONTEXT / HBM_BYTES_PER_MS
    print(f"per-request KV read in vLLM's profile, {PROFILE_CONTEXT} tokens: {kv_ms * 1e3:.1f} us")
    print("\n## Measured (per round = TPOT x tau)")
    print("| c | plain round ms | adaptive round ms | plain tau | adaptive tau |")
    print("|---|---|---|---|---|")
    for c in sorted(plain):
        p, a = plain[c], adapt[c]
        pr = p["tpot_ms_dspark"] * p["mean_acceptance_length"]
        ar = a["tpot_ms_dspark"] * a["mean_acceptance_length"]
        print(
            f"| {c} | {pr:.3f} | {ar:.3f} | {p['mean_acceptance_length']:.3f} | "
            f"{a['mean_acceptance_length']:.3f} |"
        )
    print("\n## Emulated budget (vLLM's rule and profile shape; assumptions in the docstring)")
    print("| c | profile fixed ms | KV us/req | head | drafts verified/req | tau emulated |")
    print("|---|---|---|---|---|---|")
    for c in sorted(plain):
        surv = plain[c]["per_position_acceptance"]
        for fixed in (0.8, 1.6):
            for kv in (0.0, kv_ms, 1.5 * kv_ms):
                tables = profiled_tables(fixed, kv, c)
                for name, shift in (("calibrated", 0.0), ("over-confident", 1.0)):
                    e = emulate_budget(surv, shift, c, tables)
                    print(
                        f"| {c} | {fixed} | {kv * 1e3:.1f} | {name} | "
                        f"{e['verified_per_req']:.2f} | {e['tau']:.3f} |"
                    )
    print("\n## What truncation could pay at the measured round costs (zero overhead, ideal head)")
    print("Round(m) = A + b * m drafts verified; A from the plain round at m = 7c.")
    print("| c | b us/draft token | best drafts/req | best tau | best speed-up over plain |")
    print("|---|---|---|---|---|")
    for c in sorted(plain):
        p = plain[c]
        surv = np.asarray(p["per_position_acceptance"])
        round_ms = p["tpot_ms_dspark"] * p["mean_acceptance_length"]
        for b_us in (3.0, 6.0, 12.0):
            a_ms = round_ms - b_us * 1e-3 * N * c
            best = max(
                ((1 + surv[:k].sum()) / (a_ms + b_us * 1e-3 * k * c), k) for k in range(N + 1)
            )
            full = (1 + surv.sum()) / round_ms
            print(
                f"| {c} | {b_us:.0f} | {best[1]} | {1 + surv[: best[1]].sum():.3f} | "
                f"{best[0] / full:.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
