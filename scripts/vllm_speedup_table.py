"""Decode speed-up of a DSpark draft over the target alone, from `serve.bench` JSON files.

    python scripts/vllm_speedup_table.py RESULTS_DIR [--json OUT.json]

Reads RESULTS_DIR/vllm_target_only_cC.json and vllm_VARIANT_cC.json for every other VARIANT
(dspark, dspark_adaptive: `python -m serve.bench` output, one per concurrency C) and
prints, per C and variant: mean TPOT (time per output token after the
first, i.e. decode with prefill timed apart), the decode speed-up TPOT(target-only) / TPOT(DSpark),
output tokens/s of each (prefill included), mean TTFT, and the mean acceptance length vLLM's
spec-decode counters report for the DSpark run.

Where both runs hold their requests' own figures (`serve.bench` since 2026-12-05), the speed-up
also gets a 95% interval: the two runs sent prompt i mod P as request i (at T=0 the same work), so
requests pair up by index, and the interval is the percentile bootstrap of the ratio of paired
mean TPOTs over requests resampled together (`scripts/paired_interval.py`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.paired_interval import paired_interval  # noqa: E402

BASELINE = "target_only"


def load_runs(results: Path) -> dict[int, dict[str, dict]]:
    """{concurrency: {variant: serve.bench JSON}} (variant: target_only, dspark, ...)."""
    runs: dict[int, dict[str, dict]] = {}
    for path in sorted(results.glob("vllm_*_c*.json")):
        m = re.fullmatch(r"vllm_([a-z0-9_]+?)_c(\d+)\.json", path.name)
        if m:
            runs.setdefault(int(m[2]), {})[m[1]] = json.loads(path.read_text())
    return runs


def speedup_rows(runs: dict[int, dict[str, dict]]) -> list[dict]:
    """One row per concurrency and speculative variant that has a target-only run beside it."""
    rows = []
    for c, variants in sorted(runs.items()):
        base = variants.get(BASELINE)
        for name, spec in sorted(variants.items()):
            if name == BASELINE or not base or not base["mean_tpot_ms"] or not spec["mean_tpot_ms"]:
                continue
            rows.append(_row(c, name, base, spec))
    return rows


def paired_speedup_interval(base: dict, spec: dict) -> dict | None:
    """{"value", "low", "high", "pairs"}: mean TPOT of the target-only run over the DSpark run's
    on the requests both decoded (more than one token each), with its paired percentile bootstrap
    95% interval (`scripts.paired_interval`); None where either run lacks per-request figures or
    no request pairs up."""
    own = [
        {r["index"]: r["tpot_ms"] for r in run.get("requests") or [] if r.get("tpot_ms")}
        for run in (base, spec)
    ]
    pairs = [(own[0][i], own[1][i]) for i in sorted(own[0].keys() & own[1].keys())]
    return paired_interval(pairs, lambda ps: sum(b for b, _ in ps) / sum(d for _, d in ps))


def _row(c: int, name: str, base: dict, spec: dict) -> dict:
    sd = spec.get("spec_decode") or {}
    return {
        "concurrency": c,
        "variant": name,
        "tpot_ms_target_only": base["mean_tpot_ms"],
        "tpot_ms_dspark": spec["mean_tpot_ms"],
        "decode_speedup": base["mean_tpot_ms"] / spec["mean_tpot_ms"],
        "decode_speedup_paired_ci95": paired_speedup_interval(base, spec),
        "output_tok_s_target_only": base["output_token_throughput"],
        "output_tok_s_dspark": spec["output_token_throughput"],
        "throughput_speedup": spec["output_token_throughput"] / base["output_token_throughput"],
        "ttft_ms_target_only": base["mean_ttft_ms"],
        "ttft_ms_dspark": spec["mean_ttft_ms"],
        "mean_acceptance_length": sd.get("mean_acceptance_length"),
        "per_position_acceptance": sd.get("per_position_acceptance_rates"),
        "requests": [base["completed"], spec["completed"]],
        "failed": [base["failed"], spec["failed"]],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    rows = speedup_rows(load_runs(a.results))
    if not rows:
        print(f"no pairs of vllm_target_only_cC.json / vllm_VARIANT_cC.json in {a.results}")
        return 1
    print(
        "| concurrency | variant | TPOT target-only (ms) | TPOT DSpark (ms) | decode speed-up | "
        "95% interval (paired requests) | "
        "tok/s target-only | tok/s DSpark | TTFT target-only / DSpark (ms) | vLLM tau |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tau, ci = r["mean_acceptance_length"], r["decode_speedup_paired_ci95"]
        shown = "n/a" if ci is None else f"{ci['low']:.2f}-{ci['high']:.2f}x ({ci['pairs']})"
        print(
            f"| {r['concurrency']} | {r['variant']} | {r['tpot_ms_target_only']:.2f} | "
            f"{r['tpot_ms_dspark']:.2f} | "
            f"{r['decode_speedup']:.2f}x | {shown} | {r['output_tok_s_target_only']:.1f} | "
            f"{r['output_tok_s_dspark']:.1f} | {r['ttft_ms_target_only']:.1f} / "
            f"{r['ttft_ms_dspark']:.1f} | {'n/a' if tau is None else f'{tau:.3f}'} |"
        )
    (a.json or a.results / "vllm_speedup.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
