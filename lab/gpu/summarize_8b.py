"""Headline figures of lab/gpu/bench_8b.sh's outputs -> summary.json, each beside the raw
file it comes from (`KEY_source`, relative to the folder holding summary.json).

    python3 lab/gpu/summarize_8b.py $OUT            # reads $OUT/*, writes $OUT/summary.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def best_train_row(res: dict | None) -> dict | None:
    rows = [r for r in (res or {}).get("rows", []) if "tokens_per_s" in r]
    return max(rows, key=lambda r: r["tokens_per_s"]) if rows else None


# The speed-ups at an assumed tau, computed from measured round costs: never served.
EMULATED = (
    "speedup_tau4_b128_plain",
    "speedup_tau4_b128_adaptive",
    "speedup_tau4_b128_best_fixed_k",
    "best_fixed_k_tau4_b128",
    "speedup_tau4_b128_vllm034_budget",
)


def summarize(out: Path) -> dict:
    """The headline keys in docs/results/'s format: `kind` measured at the top, `KEY_kind`
    emulated for EMULATED, `device` from the 8B trainer rows where they name one."""
    s: dict = {"kind": "measured"}
    raw8 = _load(out / "train_qwen3_8b.json")
    if raw8 and raw8.get("device"):
        s["device"] = raw8["device"]
    t8 = best_train_row(raw8)
    if t8:
        src = "train_qwen3_8b.json"
        s.update(
            train_tokens_per_s=t8["tokens_per_s"],
            train_tokens_per_s_source=src,
            train_variant=t8["variant"],
            train_variant_source=src,
            train_mfu_spec_peak=t8.get("mfu_spec_peak"),
            train_mfu_spec_peak_source=src,
            train_peak_gib=t8.get("peak_gib"),
            train_peak_gib_source=src,
        )
    ts = best_train_row(_load(out / "train_smollm2.json"))
    if ts:
        s.update(
            train_tokens_per_s_smollm2=ts["tokens_per_s"],
            train_tokens_per_s_smollm2_source="train_smollm2.json",
            train_variant_smollm2=ts["variant"],
            train_variant_smollm2_source="train_smollm2.json",
        )
    vr = _load(out / "vllm_round" / "results.json")
    if vr:
        from lab.gpu.vllm_round_cost import speedup_rows

        for r in speedup_rows(vr):
            if r["config"] == "dspark_v32k_k7" and r["batch"] in (1, 128):
                s[f"round_over_step_b{r['batch']}_v32k"] = r["round_over_step"]
                s[f"round_over_step_b{r['batch']}_v32k_source"] = "vllm_round/results.json"
    ad = _load(out / "adaptive" / "adaptive_emulation.json")
    if ad:
        for r in ad["rows"]:
            if r["batch"] == 128 and r["tau"] == 4:
                src = "adaptive/adaptive_emulation.json"
                s.update(
                    speedup_tau4_b128_plain=r["plain_k7"],
                    speedup_tau4_b128_plain_source=src,
                    speedup_tau4_b128_adaptive=r["adaptive_round_sps"],
                    speedup_tau4_b128_adaptive_source=src,
                )
                for key, col in (
                    ("speedup_tau4_b128_best_fixed_k", "best_fixed"),
                    ("best_fixed_k_tau4_b128", "best_fixed_k"),
                    ("speedup_tau4_b128_vllm034_budget", "vllm034_budget"),
                ):
                    if r.get(col) is not None:  # absent from older emulation files
                        s[key], s[f"{key}_source"] = r[col], src
    for key in EMULATED:
        if key in s:
            s[f"{key}_kind"] = "emulated"
    return s


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "gpu-out")
    s = summarize(out)
    (out / "summary.json").write_text(json.dumps(s, indent=2))
    print(json.dumps(s, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
