"""Decode speed-up of a DSpark draft over the target alone, from `serve.bench` JSON files.

    python scripts/vllm_speedup_table.py RESULTS_DIR [--json OUT.json]

Reads RESULTS_DIR/vllm_target_only_cC.json and vllm_VARIANT_cC.json for every other VARIANT
(dspark, dspark_adaptive; scripts/gpu/smollm2_serve.sh writes them, one per concurrency C) and
prints, per C and variant: mean TPOT (time per output token after the
first, i.e. decode with prefill timed apart), the decode speed-up TPOT(target-only) / TPOT(DSpark),
output tokens/s of each (prefill included), mean TTFT, and the mean acceptance length vLLM's
spec-decode counters report for the DSpark run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

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


def _row(c: int, name: str, base: dict, spec: dict) -> dict:
    sd = spec.get("spec_decode") or {}
    return {
        "concurrency": c,
        "variant": name,
        "tpot_ms_target_only": base["mean_tpot_ms"],
        "tpot_ms_dspark": spec["mean_tpot_ms"],
        "decode_speedup": base["mean_tpot_ms"] / spec["mean_tpot_ms"],
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
        "tok/s target-only | tok/s DSpark | TTFT target-only / DSpark (ms) | vLLM tau |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tau = r["mean_acceptance_length"]
        print(
            f"| {r['concurrency']} | {r['variant']} | {r['tpot_ms_target_only']:.2f} | "
            f"{r['tpot_ms_dspark']:.2f} | "
            f"{r['decode_speedup']:.2f}x | {r['output_tok_s_target_only']:.1f} | "
            f"{r['output_tok_s_dspark']:.1f} | {r['ttft_ms_target_only']:.1f} / "
            f"{r['ttft_ms_dspark']:.1f} | {'n/a' if tau is None else f'{tau:.3f}'} |"
        )
    (a.json or a.results / "vllm_speedup.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
