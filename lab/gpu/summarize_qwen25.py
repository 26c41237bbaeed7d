"""Issue 56's goal keys from one Qwen2.5-Coder-1.5B session's raw outputs -> summary.json.

    python3 lab/gpu/summarize_qwen25.py RUN_DIR \
        --summary docs/results/qwen25_coder_1p5b/summary.json \
        [--device "NVIDIA H100 80GB HBM3"]

RUN_DIR is the session's results folder as it came back (`lab/gpu/qwen25_serve.sh` and
`qwen25_stage.sh` outputs, kept under docs/results/qwen25_coder_1p5b/RUN/):
  serve/tau_dspark_{code,chat}_t0.json, serve/tau_dspark_code_t1.json   whole test sets (vLLM)
  serve/tau_dspark_{code,chat}_first_t0.json     the prompts the engine evaluated too
  serve/vllm_{target_only,dspark,dspark_adaptive}_cC.json              decode speed, T=0
  recipe/evaluate/test/eval.json                 the engine (`serve.evaluate`) on the test split
  dspark_vs_dflash/eval.json                     both drafts, test split (qwen25_dflash_twin.sh)
Each key is read from one raw file, named in `KEY_source` (relative to the summary's folder);
`KEY_ci95` where the key is a mean: acceptance lengths by the bootstrap over requests of vLLM's
own per-request figures (absent where the server sent none), speed-ups and the adaptive ratio by
the paired bootstrap over requests (scripts/vllm_speedup_table.py). A key whose inputs are missing
is left out and named on stderr. Existing keys of the summary (the trainer's) are kept.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.vllm_speedup_table import paired_speedup_interval  # noqa: E402

LEVELS = (1, 8, 32, 128)
TAUS = {  # key -> serve.bench file (vLLM's counters over the whole test set of that domain)
    "tau_t0_code": "serve/tau_dspark_code_t0.json",
    "tau_t0_chat": "serve/tau_dspark_chat_t0.json",
    "tau_t1_code": "serve/tau_dspark_code_t1.json",
}


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def tau_keys(run: Path) -> dict:
    out = {}
    for key, rel in TAUS.items():
        b = _load(run / rel)
        sd = (b or {}).get("spec_decode") or {}
        if sd.get("mean_acceptance_length") is None:
            continue
        out[key], out[f"{key}_source"] = sd["mean_acceptance_length"], rel
        pr = b.get("per_request_acceptance")
        if pr:
            out[f"{key}_ci95"] = pr["ci95"]
    return out


def speed_keys(run: Path) -> dict:
    """speedup_cC: the better of plain and adaptive DSpark over the target alone (mean TPOT
    ratio, T=0); adaptive_over_plain_min: the smallest adaptive-over-plain ratio over C."""
    out, ratios = {}, []
    for c in LEVELS:
        runs = {
            v: _load(run / f"serve/vllm_{v}_c{c}.json")
            for v in ("target_only", "dspark", "dspark_adaptive")
        }
        base = runs["target_only"]
        best = None
        for v in ("dspark", "dspark_adaptive"):
            spec = runs[v]
            if not base or not spec or not base["mean_tpot_ms"] or not spec["mean_tpot_ms"]:
                continue
            sp = base["mean_tpot_ms"] / spec["mean_tpot_ms"]
            if best is None or sp > best[0]:
                best = (sp, v, paired_speedup_interval(base, spec))
        if best:
            key, src = f"speedup_c{c}", f"serve/vllm_{best[1]}_c{c}.json"
            out[key], out[f"{key}_source"] = best[0], src
            out[f"{key}_variant"], out[f"{key}_variant_source"] = best[1], src
            if best[2]:
                out[f"{key}_ci95"] = [best[2]["low"], best[2]["high"]]
        plain, adaptive = runs["dspark"], runs["dspark_adaptive"]
        if plain and adaptive and plain["mean_tpot_ms"] and adaptive["mean_tpot_ms"]:
            ci = paired_speedup_interval(plain, adaptive)
            ratios.append((plain["mean_tpot_ms"] / adaptive["mean_tpot_ms"], c, ci))
    if ratios:
        r, c, ci = min(ratios)
        src = f"serve/vllm_dspark_adaptive_c{c}.json"
        out["adaptive_over_plain_min"], out["adaptive_over_plain_min_source"] = r, src
        out["adaptive_over_plain_min_concurrency"] = c
        out["adaptive_over_plain_min_concurrency_source"] = src
        if ci:
            out["adaptive_over_plain_min_ci95"] = [ci["low"], ci["high"]]
    return out


def engine_keys(run: Path) -> dict:
    """vllm_vs_engine_accept_rel_diff: the larger over code and chat of |tau(vLLM) - tau(engine)|
    / tau(engine) on the same first test prompts at T=0."""
    rel = "recipe/evaluate/test/eval.json"
    ev = _load(run / rel)
    if not ev:
        return {}
    diffs = []
    for row in ev["rows"]:
        if row["temperature"] != 0.0:
            continue
        b = _load(run / f"serve/tau_dspark_{row['domain']}_first_t0.json")
        sd = (b or {}).get("spec_decode") or {}
        if sd.get("mean_acceptance_length") and row["mean_acceptance_length"]:
            engine = row["mean_acceptance_length"]
            diffs.append(abs(sd["mean_acceptance_length"] - engine) / engine)
    if not diffs:
        return {}
    return {
        "vllm_vs_engine_accept_rel_diff": max(diffs),
        "vllm_vs_engine_accept_rel_diff_source": rel,
    }


def dflash_keys(run: Path) -> dict:
    """dspark_over_dflash_t0_code (and _t0_chat, _t1_code, _t1_chat): DSpark's realized tau over
    its DFlash twin's on the same test prompts (lab/gpu/qwen25_dflash_twin.sh), paired interval."""
    rel = "dspark_vs_dflash/eval.json"
    ev = _load(run / rel)
    out = {}
    for row in (ev or {}).get("rows", []):
        ratio = row.get("vs_first")
        if row["draft"] != "dspark" or not ratio:
            continue
        key = f"dspark_over_dflash_t{row['temperature']:g}_{row['domain']}"
        out[key], out[f"{key}_source"] = ratio["value"], rel
        out[f"{key}_ci95"] = [ratio["low"], ratio["high"]]
    return out


def version_key(run: Path) -> dict:
    rel = "serve/serve_dspark.log"
    log = run / rel
    m = re.search(r"V1 LLM engine \(v([0-9][^)]*)\)", log.read_text()) if log.is_file() else None
    return {"vllm_version": m[1], "vllm_version_source": rel} if m else {}


def summarize(run: Path, prefix: str) -> dict:
    keys = {**tau_keys(run), **speed_keys(run), **engine_keys(run), **dflash_keys(run)}
    keys.update(version_key(run))
    return {
        k: (f"{prefix}/{v}" if k.endswith("_source") and prefix else v) for k, v in keys.items()
    }


GOALS = [
    "tau_t0_code",
    "tau_t0_chat",
    "tau_t1_code",
    *(f"speedup_c{c}" for c in LEVELS),
    "adaptive_over_plain_min",
    "vllm_vs_engine_accept_rel_diff",
    "dspark_over_dflash_t0_code",
    "vllm_version",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--summary", type=Path, required=True)
    ap.add_argument("--device", help="the card the run served on, as KEY_device of each key")
    args = ap.parse_args(argv)
    prefix = str(args.run.resolve().relative_to(args.summary.parent.resolve()))
    keys = summarize(args.run, "" if prefix == "." else prefix)
    missing = [g for g in GOALS if g not in keys]
    if missing:
        print(f"not in {args.run}: {', '.join(missing)}", file=sys.stderr)
    s = _load(args.summary) or {"kind": "measured"}
    s.update(keys)
    if args.device:  # per key: the summary's other rows (the trainer's) may come from another card
        s.update({f"{g}_device": args.device for g in GOALS if g in keys})
    args.summary.write_text(json.dumps(s, indent=2) + "\n")
    for g in GOALS:
        if g in keys:
            ci = keys.get(f"{g}_ci95")
            shown = f"{keys[g]:.3f}" if isinstance(keys[g], float) else str(keys[g])
            print(f"{g:34} {shown}" + (f"  [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
