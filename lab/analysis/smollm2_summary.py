"""Headline figures of the SmolLM2 run, each read from the raw file it comes from.

    python lab/analysis/smollm2_summary.py RESULTS --device CARD [--engine-cpu FILE] [--gate FILE]
        [--out FILE]

Reads, under the results folder: smollm2_dspark_vs_dflash.json (scripts/eval_acceptance.py),
smollm2_dspark.summary.json (train.distill), vllm_speedup.json (scripts/vllm_speedup_table.py),
vllm_gate.json (lab/gpu/vllm_vs_engine.py; --gate: another run's gate of the same draft)
and, with --engine-cpu, a scripts/bench_engine.py --json file. Writes --out (default
RESULTS/summary.json): every key beside `KEY_source`, the file it was read from; a figure whose
file is missing is null (and says so) rather than left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.paired_interval import tau_ratio_interval  # noqa: E402
from scripts.plot_acceptance import pooled_tau  # noqa: E402
from scripts.results_tables import in_results_format  # noqa: E402

HELDOUT_DOMAINS = ("sharegpt", "humaneval")  # smollm2_evaluate.sh's default prompt sets


def load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def summary(res: Path, engine_cpu: Path | None, gate_path: Path | None = None) -> dict:
    out: dict = {}

    def put(key, value, source: Path | None):
        out[key] = value
        out[f"{key}_source"] = str(source) if source is not None else None

    ev_path = res / "smollm2_dspark_vs_dflash.json"
    ev = load(ev_path) or []

    def engine_tau(draft, t, domain):
        rows = [r for r in ev if (r["draft"], r["temperature"], r["domain"]) == (draft, t, domain)]
        return rows[0]["mean_acceptance_length"] if rows else None

    put("tau_t0_sharegpt", engine_tau("dspark", 0.0, "sharegpt"), ev_path)
    put("tau_t1_sharegpt", engine_tau("dspark", 1.0, "sharegpt"), ev_path)
    put("tau_t0_humaneval", engine_tau("dspark", 0.0, "humaneval"), ev_path)
    put("tau_t1_humaneval", engine_tau("dspark", 1.0, "humaneval"), ev_path)
    # Pooled over the held-out domains: an evaluation may also hold prompts the drafts trained
    # on (smollm2_evaluate.sh --domain sharegpt_read=...), which no held-out figure includes.
    held = [r for r in ev if r["domain"] in HELDOUT_DOMAINS]
    for t, key in ((0.0, "dspark_over_dflash_t0"), (1.0, "dspark_over_dflash_t1")):
        ds = [r for r in held if r["draft"] == "dspark" and r["temperature"] == t]
        df = [r for r in held if r["draft"] == "dflash" and r["temperature"] == t]
        put(key, pooled_tau(ds) / pooled_tau(df) if ds and df else None, ev_path)
        # Its paired 95% interval over the prompts, where the rows kept each prompt's rounds.
        ci = tau_ratio_interval(ds, df) if ds and df else None
        if ci:
            put(f"{key}_ci95", [ci["low"], ci["high"]], ev_path)
    tr_path = res / "smollm2_dspark.summary.json"
    tr = load(tr_path)
    put("analytic_tau_sharegpt", tr["eval"]["analytic_tau"] if tr else None, tr_path)
    sp_path = res / "vllm_speedup.json"
    sp = {
        r["concurrency"]: r for r in load(sp_path) or [] if r.get("variant", "dspark") == "dspark"
    }
    for c in (1, 8, 32):
        put(f"vllm_speedup_b{c}", sp[c]["decode_speedup"] if c in sp else None, sp_path)
        # The paired 95% interval, where the serving rows kept their requests' figures.
        ci = sp[c].get("decode_speedup_paired_ci95") if c in sp else None
        if ci:
            put(f"vllm_speedup_b{c}_ci95", [ci["low"], ci["high"]], sp_path)
    put("vllm_tau_t0_sharegpt_b1", sp[1]["mean_acceptance_length"] if 1 in sp else None, sp_path)
    gate_path = gate_path or res / "vllm_gate.json"
    gate = load(gate_path)
    if gate:
        diffs = []
        for t in ("0.0", "1.0"):
            v, e = gate["vllm"][t], gate["engine"][t]
            diffs.append(
                abs(v["mean_acceptance_length"] - e["mean_acceptance_length"])
                / e["mean_acceptance_length"]
            )
        put("vllm_vs_engine_accept_rel_diff", max(diffs), gate_path)
        put("vllm_gate_passed", all(gate["checks"].values()), gate_path)
    else:
        put("vllm_vs_engine_accept_rel_diff", None, gate_path)
    cpu = load(engine_cpu) if engine_cpu else None
    row1 = next((r for r in (cpu or {}).get("rows", []) if r["batch"] == 1), None)
    # With --num-spec variants, the headline is the checkpoint's own block (the most drafts),
    # what a user gets by default; every variant is kept beside it.
    variants = (row1 or {}).get("variants") or ([row1] if row1 else [])
    native = max(variants, key=lambda v: v.get("num_spec") or 0) if variants else None
    put("engine_cpu_speedup_b1", native["speedup"] if native else None, engine_cpu)
    if len(variants) > 1:
        by_n = {str(v["num_spec"]): v["speedup"] for v in variants}
        put("engine_cpu_speedup_b1_by_num_spec", by_n, engine_cpu)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--engine-cpu", type=Path, default=None)
    ap.add_argument("--gate", type=Path, default=None, help="default: RESULTS/vllm_gate.json")
    ap.add_argument("--note", default=None, help="what run these figures are from")
    ap.add_argument("--device", required=True, help="the card they were measured on")
    ap.add_argument("--out", type=Path, default=None, help="default: RESULTS/summary.json")
    a = ap.parse_args(argv)
    s = summary(a.results, a.engine_cpu, a.gate)
    out = a.out or a.results / "summary.json"
    s = in_results_format(s, out.parent, a.note, a.device)
    out.write_text(json.dumps(s, indent=2) + "\n")
    for k, v in s.items():
        if not k.endswith("_source") and k not in ("note", "device", "kind"):
            shown = "missing" if v is None else (f"{v:.3f}" if isinstance(v, float) else v)
            print(f"{k:<34} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
