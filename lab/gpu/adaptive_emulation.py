"""What confidence-scheduled (adaptive) verification buys, from measured vLLM costs (CPU math).

    python3 lab/gpu/adaptive_emulation.py --costs $OUT/vllm_round/results.json \
        --out $OUT/adaptive

Cost model, from lab/gpu/vllm_round_cost.py's measurements at each batch B (32k draft vocab):
    t_step(B)        target-only decode step (median)
    t_verify(m)      one target forward over m tokens (the verify-cost table, sps_table.json)
    t_round(B, K)    a DSpark round drafting and verifying K tokens per request
    t_draft(B)       = t_round(B, 7) - t_verify(8 B): drafting 7 tokens + sampling + overhead
An adaptive round drafts 7 tokens per request, then verifies v_r <= 7 of request r's drafts:
    t_adaptive = t_draft(B) + t_verify(B + sum_r v_r)   (= t_round(B, 7) if all 7 are verified)
t_draft is not clamped at 0: the table prices a forward as a prefill step, which costs more than
the decode path's forward at small m (2026-12-05, Qwen3-8B shape: 7.6 ms for 8 tokens against a
7.06 ms round at batch 1), so t_draft(1) < 0 is an offset that keeps the model exact at m = 8 B.
Check of the model: t_round(B, K) for K < 7 is predicted as t_draft(B) + t_verify(B (K + 1))
(an upper bound: the Markov loop runs K steps, not 7) and printed beside the measured one.

Acceptance model (synthetic, stated): request r accepts each draft position independently with
probability alpha_r (geometric survival alpha_r^j), logit(alpha_r) ~ N(mu, s^2) across requests
(heterogeneity; s = --spread), mu solved so that the mean acceptance length with 7 drafts,
E[1 + sum_{j<=7} alpha_r^j], equals tau. The confidence head is calibrated up to
noise: c_{r,j} = sigmoid(logit(alpha_r) + N(0, --conf-noise)) (the head predicts each slot's
conditional acceptance; survival a_{r,j} = prod_{i<=j} c_{r,i}, as common/sampling/adaptive.py).
Tokens per round of request r verifying v_r drafts: 1 + sum_{j<=v_r} alpha_r^j (expected).

Policies (speed-up = tokens/s over target-only's B / t_step(B), ratio of means over --draws
batches): plain K = 7; the best fixed K in {1, 3, 5, 7} (measured t_round(B, K)); adaptive with
the round-rate table SPS_B(m) = 1 / (t_draft(B) + t_verify(m)) (written as sps_round_bB.json:
the table a server at batch B should load); adaptive with the verify-only table (what the
engine's own start-up profile measures); and vLLM 0.34's own policy on the same costs
(common/sampling/draft_budget.py: one draft budget per batch, the first argmax of expected tokens
over the round's cost across every budget, handed out by survival), which searches past the
first admission that does not pay, where Algorithm 1 stops.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.sampling.adaptive import SPSTable, plan_verify_lengths  # noqa: E402
from common.sampling.draft_budget import allocation_by_budget, choose_draft_budget  # noqa: E402

N_DRAFT = 7


# ---------------------------------------------------------------------------- cost model
class CostModel:
    """Per-batch costs in seconds (see the module docstring)."""

    def __init__(self, t_step: dict, t_round: dict, verify: SPSTable):
        self.t_step, self.t_round, self.verify = t_step, t_round, verify  # t_round[(B, K)]

    def t_verify(self, m) -> float:
        return float(1.0 / self.verify(m))

    def t_draft(self, b: int) -> float:
        return self.t_round[(b, N_DRAFT)] - self.t_verify(b * (N_DRAFT + 1))

    def t_adaptive(self, b: int, m: int) -> float:
        """A round at batch b that drafts 7 tokens a request and verifies m tokens in all."""
        t = self.t_draft(b) + self.t_verify(m)
        if t <= 0:
            raise ValueError(f"batch {b}, {m} tokens: the cost model gives {t * 1e3:.2f} ms")
        return t

    def round_table(self, b: int) -> SPSTable:
        sizes = sorted({*self.verify.sizes, b, b * (N_DRAFT + 1)})
        rates = [1.0 / self.t_adaptive(b, m) for m in sizes]
        return SPSTable(sizes, rates, {"batch": b, "t_draft_s": self.t_draft(b)})

    @classmethod
    def from_results(cls, results: dict, vocab: str = "v32k") -> CostModel:
        cfgs = results["configs"]
        target = cfgs["target"]
        t_step = {int(b): d["median_ms"] / 1e3 for b, d in target["decode"].items()}
        ms = target["forward_ms_by_tokens"]
        sizes = sorted(int(m) for m in ms)
        verify = SPSTable(sizes, [1e3 / ms[str(m)] for m in sizes])
        t_round = {}
        for name, c in cfgs.items():
            if name.startswith(f"dspark_{vocab}_") and "decode" in c:
                for b, d in c["decode"].items():
                    if "median_ms" in d:
                        t_round[(int(b), int(c["k"]))] = d["median_ms"] / 1e3
        return cls(t_step, t_round, verify)


def model_check(cost: CostModel) -> list[dict]:
    """Measured t_round(B, K < 7) against the model's t_draft(B) + t_verify(B (K + 1))."""
    rows = []
    for (b, k), measured in sorted(cost.t_round.items()):
        if k == N_DRAFT or (b, N_DRAFT) not in cost.t_round:
            continue
        predicted = cost.t_adaptive(b, b * (k + 1))
        rows.append(
            {
                "batch": b,
                "k": k,
                "measured_ms": 1e3 * measured,
                "model_ms": 1e3 * predicted,
                "model_over_measured": predicted / measured,
            }
        )
    return rows


# ---------------------------------------------------------------------------- acceptance
def mean_tau(alpha: torch.Tensor, n: int = N_DRAFT) -> float:
    j = torch.arange(1, n + 1, dtype=torch.float64)
    return float((1 + (alpha.unsqueeze(-1) ** j).sum(-1)).mean())


def draw_alphas(tau: float, spread: float, count: int, seed: int) -> torch.Tensor:
    """`count` per-request acceptance rates sigmoid(mu + spread * z_r), z_r ~ N(0, 1), with mu
    found by bisection (same z for every mu) so that their mean acceptance length is `tau`."""
    if not 1.0 < tau < N_DRAFT + 1:
        raise ValueError(f"tau={tau}: must be in (1, {N_DRAFT + 1})")
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(count, generator=g, dtype=torch.float64)
    lo, hi = -30.0, 30.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_tau(torch.sigmoid(mid + spread * z)) < tau else (lo, mid)
    return torch.sigmoid((lo + hi) / 2 + spread * z)


def confidences(alpha: torch.Tensor, noise: float, seed: int) -> torch.Tensor:
    """[R, 7] per-slot confidence: logit(alpha_r) + N(0, noise), squashed."""
    g = torch.Generator().manual_seed(seed)
    logit = torch.logit(alpha.clamp(1e-6, 1 - 1e-6)).unsqueeze(1).expand(-1, N_DRAFT)
    return torch.sigmoid(logit + noise * torch.randn(logit.shape, generator=g, dtype=torch.float64))


def expected_tokens(alpha: torch.Tensor, verify_len: torch.Tensor) -> float:
    """sum_r 1 + sum_{j <= v_r} alpha_r^j."""
    j = torch.arange(1, N_DRAFT + 1, dtype=torch.float64)
    surv = alpha.unsqueeze(1) ** j  # [R, 7]
    keep = j.unsqueeze(0) <= verify_len.unsqueeze(1)
    return float((1 + (surv * keep).sum(1)).sum())


# ---------------------------------------------------------------------------- policies
def vllm_budget_lengths(conf: torch.Tensor, step_cost: torch.Tensor) -> torch.Tensor:
    """[R] verify lengths by vLLM 0.34's draft budget, with this round's confidences (no copy
    lag). step_cost: [R N + 1] a round's cost verifying m = 0..R N drafts (`budget_costs`)."""
    r, n = conf.shape
    drafts = torch.full((r,), n, dtype=torch.long)
    return allocation_by_budget(conf, drafts)[choose_draft_budget(conf, drafts, step_cost)]


def budget_costs(cost: CostModel, b: int) -> torch.Tensor:
    """vLLM's varlen batch: verifying m of the b * 7 drafts costs an adaptive round over b + m
    tokens, m = 0..b * 7."""
    return torch.tensor([cost.t_adaptive(b, b + m) for m in range(b * N_DRAFT + 1)])


def emulate(cost: CostModel, b: int, tau: float, args) -> dict:
    """Speed-ups of the policies at batch b and mean acceptance length tau."""
    t_step = cost.t_step[b]
    base_rate = b / t_step
    tables = {"adaptive_round_sps": cost.round_table(b), "adaptive_verify_sps": cost.verify}
    policies = {  # name -> [R, 7] confidences -> [R] verify lengths
        name: (lambda conf, table=table: plan_verify_lengths(conf, table).verify_len)
        for name, table in tables.items()
    }
    step_cost = budget_costs(cost, b)
    policies["vllm034_budget"] = lambda conf: vllm_budget_lengths(conf, step_cost)
    acc = {k: [0.0, 0.0] for k in policies}  # [tokens, seconds]
    fixed = {k: [0.0, 0.0] for k in (1, 3, 5, 7) if (b, k) in cost.t_round}
    verified = {k: 0.0 for k in policies}
    for d in range(args.draws):
        alpha = draw_alphas(tau, args.spread, b, seed=1000 * d + b)
        for k in fixed:
            full = torch.full((b,), k, dtype=torch.long)
            fixed[k][0] += expected_tokens(alpha, full)
            fixed[k][1] += cost.t_round[(b, k)]
        conf = confidences(alpha, args.conf_noise, seed=7 + d)
        for name, plan in policies.items():
            v = plan(conf)
            acc[name][0] += expected_tokens(alpha, v)
            acc[name][1] += cost.t_adaptive(b, b + int(v.sum()))
            verified[name] += float(v.float().mean()) / args.draws
    out = {"batch": b, "tau": tau}
    out["plain_k7"] = fixed[7][0] / fixed[7][1] / base_rate
    for name, (tok, sec) in acc.items():
        out[name] = tok / sec / base_rate if sec else None
    best = max(fixed, key=lambda k: fixed[k][0] / fixed[k][1]) if fixed else None
    out["best_fixed_k"] = best
    out["best_fixed"] = fixed[best][0] / fixed[best][1] / base_rate if best else None
    out["mean_verified"] = verified
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", required=True, help="vllm_round_cost.py's results.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", default="v32k")
    ap.add_argument("--batches", type=int, nargs="+", default=[128, 32, 8, 1])
    ap.add_argument("--taus", type=float, nargs="+", default=[2, 3, 4, 5, 6])
    ap.add_argument("--spread", type=float, default=1.0, help="std of logit(alpha_r)")
    ap.add_argument("--conf-noise", type=float, default=0.5, help="logit noise of the confidence")
    ap.add_argument("--draws", type=int, default=16)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cost = CostModel.from_results(json.loads(Path(args.costs).read_text()), args.vocab)
    rows = []
    for b in args.batches:
        if b not in cost.t_step or (b, N_DRAFT) not in cost.t_round:
            print(f"batch {b}: not measured (needs target and dspark_{args.vocab}_k7), skipped")
            continue
        cost.round_table(b).save(out / f"sps_round_b{b}.json")
        for tau in args.taus:
            rows.append(emulate(cost, b, tau, args))
    keys = (
        "batch",
        "tau",
        "plain_k7",
        "best_fixed",
        "best_fixed_k",
        "adaptive_round_sps",
        "adaptive_verify_sps",
        "vllm034_budget",
    )
    print(
        f"speed-up over target-only; logit(alpha_r) ~ N(mu, {args.spread}^2), confidence logit "
        f"noise {args.conf_noise}, {args.draws} batches per point"
    )
    print(" | ".join(keys) + " | mean verified (round / verify sps)")
    print(" | ".join("---" for _ in range(len(keys) + 1)))
    for r in rows:
        cells = [f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys]
        mv = r["mean_verified"]
        cells.append(f"{mv['adaptive_round_sps']:.2f} / {mv['adaptive_verify_sps']:.2f}")
        print(" | ".join(cells))
    check = model_check(cost)
    if check:
        print("\nthe cost model against the measured rounds with K < 7 (model: 7 drafts' cost)")
        print("batch | K | measured ms | model ms | model / measured")
        print("--- | --- | --- | --- | ---")
        for c in check:
            print(
                f"{c['batch']} | {c['k']} | {c['measured_ms']:.2f} | {c['model_ms']:.2f} | "
                f"{c['model_over_measured']:.3f}"
            )
    res = {
        "args": vars(args),
        "rows": rows,
        "model_check": check,
        "t_draft_s": {str(b): cost.t_draft(b) for b in args.batches if (b, 7) in cost.t_round},
    }
    (out / "adaptive_emulation.json").write_text(json.dumps(res, indent=2))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
