"""Acceptance of a vLLM serving run beside the embedded engine's on the same prompts, from files.

    python lab/analysis/served_vs_engine_table.py --served vllm_dspark_c1.json \
        --engine ENGINE.json [--draft NAME] [--domain sharegpt] [--temperature 0] [--json OUT]

--served: a `serve.bench` JSON (its `spec_decode`, vLLM's pooled counters over the run);
--engine: a `scripts/eval_acceptance.py` JSON, the row of --draft / --domain / --temperature (the
first draft's where --draft is not given). Both must hold the same prompts: `serve.bench
--num-prompts N` sends the first N held-out prompts within 768 tokens, as
`eval_acceptance.py --num-prompts N` reads them.

Prints per position the conditional acceptance of both (accepted at k / drafts that reached k;
vLLM's reached counts are derived the same way the engine's are), a two-proportion z-test at
family level --alpha (Bonferroni over the positions) with its minimum detectable difference at 80%
power, and the mean acceptance lengths with their relative difference. The test is
`lab/gpu/vllm_vs_engine.py`'s, which runs both stacks itself on one GPU; this one compares
runs made apart (another machine, another batch), so it is a comparison, not that gate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.gpu.vllm_vs_engine import compare_acceptance  # noqa: E402
from serve.engine.stats import SpecDecodeStats  # noqa: E402


def served_counts(bench: dict) -> dict:
    """A serve.bench run's pooled counters as the engine reports its own (`SpecDecodeStats`:
    `accepted_per_pos`, `reached_per_pos`, mean acceptance length), and its request count."""
    sd = bench.get("spec_decode")
    if not sd or not sd.get("num_drafts"):
        raise SystemExit("--served: no spec-decode counters in that file (a target-only run?)")
    acc = list(sd["accepted_per_pos"])
    stats = SpecDecodeStats(
        len(acc),
        sd["num_drafts"],
        sd["num_draft_tokens"],
        sd["num_accepted_tokens"],
        acc,
        sd.get("num_verified_draft_tokens"),
    )
    return {
        **stats.report(),
        "requests": len(bench.get("requests", [])) or bench["config"]["num_prompts"],
    }


def engine_row(rows: list[dict], draft: str | None, domain: str, temperature: float) -> dict:
    draft = draft or rows[0]["draft"]
    for r in rows:
        if (r["draft"], r["domain"], r["temperature"]) == (draft, domain, temperature):
            return r
    have = sorted({(r["draft"], r["domain"], r["temperature"]) for r in rows})
    raise SystemExit(f"--engine: no row for {(draft, domain, temperature)}; it holds {have}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--served", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--domain", default="sharegpt")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--alpha", type=float, default=0.01, help="family level over the positions")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    served = served_counts(json.loads(Path(a.served).read_text()))
    engine = engine_row(json.loads(Path(a.engine).read_text()), a.draft, a.domain, a.temperature)
    if engine["prompts"] != served["requests"]:
        print(
            f"note: {served['requests']} served requests, {engine['prompts']} engine prompts",
            file=sys.stderr,
        )
    k = len(served["accepted_per_pos"])
    rows = compare_acceptance(served, engine, a.alpha / k)
    tau_v, tau_e = served["mean_acceptance_length"], engine["mean_acceptance_length"]
    rel = abs(tau_v - tau_e) / tau_e
    which = f"{engine['draft']}, {a.domain}, T={a.temperature:g}"
    print(f"# served {a.served}, engine {a.engine} ({which})")
    print("| position | vLLM | engine | reached (vLLM / engine) | z | p | MDD (80%) | differs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("mdd") is None:
            print(f"| {r['pos']} | - | - | {r['n'][0]} / {r['n'][1]} | - | - | - | - |")
            continue
        differs = "yes" if r["rejects"] else "no"
        print(
            f"| {r['pos']} | {r['rate'][0]:.3f} | {r['rate'][1]:.3f} | {r['n'][0]} / {r['n'][1]} "
            f"| {r['z']:.2f} | {r['p_value']:.3f} | {r['mdd']:.3f} | {differs} |"
        )
    taus = f"vLLM {tau_v:.3f}, engine {tau_e:.3f}"
    print(f"\nmean acceptance length: {taus}, relative difference {rel:.4f}")
    if a.json:
        out = {"positions": rows, "tau_served": tau_v, "tau_engine": tau_e, "tau_rel_diff": rel}
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
