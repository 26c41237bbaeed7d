"""The dispatch check of `lab/gpu/vllm034_checks.sh dispatch` -> a derived table and summary keys.

    python3 lab/gpu/summarize_round_dispatch.py FOLDER [--summary SUMMARY_JSON]

FOLDER holds the two runs of `vllm_round_cost.py --dispatch-log` as they came back:
`round_tokens/results.json` (CUDA graphs sized by token counts) and `round_requests/results.json`
(by request counts). Each configuration's t_step / t_round comes from the first run that finished
it (tokens first), so the target step and the DSpark round may come from different engines of the
same machine and session; `round_dispatch.json` says which file gave each.

A decode dispatch is one whose batch is a uniform decode: `num_tokens == num_reqs x q` with q the
model's query length (target alone 1, DSpark verify K + 1, DSpark draft K). Its share replayed as
a FULL CUDA graph answers suspect #1 of lab/analysis/vllm034_round_suspects.md; the other
dispatches (prefill and mixed steps) are listed but not counted.

Writes FOLDER/round_dispatch.json and prints it as a table; with --summary, merges the keys
`vllm034_round_over_step_bB` and `vllm034_decode_full_graph_share` (source: round_dispatch.json)
into that summary.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.gpu.vllm_round_cost import speedup_rows  # noqa: E402

RUNS = ("round_tokens", "round_requests")


def _split(key: str) -> tuple[str, str, int | None, int | None]:
    """'target FULL 64 8' -> ('target', 'FULL', 64, 8); 'None' / '?' counts -> None."""
    model, mode, tokens, reqs = key.split()
    as_int = lambda s: int(s) if s.isdigit() else None  # noqa: E731
    return model, mode, as_int(tokens), as_int(reqs)


def query_len(config: str, model: str, k: int) -> int:
    if config == "target":
        return 1
    return k + 1 if model == "target" else k


def dispatch_shares(config: str, k: int, counts: dict[str, int]) -> dict[str, dict]:
    """{model: {"decode": n, "decode_full": n, "other": {key: n}}} of one batch's dispatches."""
    out: dict[str, dict] = {}
    for key, n in counts.items():
        model, mode, tokens, reqs = _split(key)
        m = out.setdefault(model, {"decode": 0, "decode_full": 0, "other": {}})
        if tokens is not None and reqs is not None and tokens == reqs * query_len(config, model, k):
            m["decode"] += n
            m["decode_full"] += n if mode == "FULL" else 0
        else:
            m["other"][key] = n
    return out


def derive(folder: Path) -> dict:
    configs: dict[str, dict] = {}
    for run in RUNS:
        path = folder / run / "results.json"
        if not path.is_file():
            continue
        res = json.loads(path.read_text())
        for name, c in res["configs"].items():
            if name not in configs and "decode" in c:
                configs[name] = {
                    **c,
                    "file": f"{run}/results.json",
                    "capture": res["args"]["capture"],
                }
    # t_round / t_step as vllm_round_cost.py's own table computes it, over the merged runs
    ratios = {
        (r["config"], r["batch"]): r["round_over_step"] for r in speedup_rows({"configs": configs})
    }
    rows = []
    for name, c in configs.items():
        k = c.get("k", 0)
        for b, d in c["decode"].items():
            if not b.isdigit() or "median_ms" not in d:
                continue
            row = {"config": name, "batch": int(b), "capture": c["capture"], "file": c["file"]}
            row["median_ms"] = d["median_ms"]
            if (name, int(b)) in ratios:
                row["over_target_step"] = ratios[name, int(b)]
            row["dispatch"] = dispatch_shares(name, k, c["decode"].get(f"dispatch_{b}", {}))
            rows.append(row)
    shares = [
        m["decode_full"] / m["decode"] for r in rows for m in r["dispatch"].values() if m["decode"]
    ]
    return {
        "inputs": [
            f"{run}/results.json" for run in RUNS if (folder / run / "results.json").is_file()
        ],
        "rows": sorted(rows, key=lambda r: (r["config"], r["batch"])),
        "decode_full_graph_share_min": min(shares) if shares else None,
    }


def print_table(d: dict) -> None:
    print("config | capture | batch | median ms | / target step | decode dispatches FULL")
    print("--- | --- | --- | --- | --- | ---")
    for r in d["rows"]:
        full = ", ".join(f"{m} {v['decode_full']}/{v['decode']}" for m, v in r["dispatch"].items())
        ratio = f"{r['over_target_step']:.2f}" if "over_target_step" in r else "-"
        cells = [r["config"], r["capture"], r["batch"], f"{r['median_ms']:.2f}", ratio, full]
        print(" | ".join(map(str, cells)))
    print(f"smallest FULL share of decode dispatches: {d['decode_full_graph_share_min']}")


def merge_summary(d: dict, summary: Path, derived: Path) -> None:
    s = json.loads(summary.read_text()) if summary.is_file() else {}
    src = str(derived.relative_to(summary.parent))
    for r in d["rows"]:
        if r["config"] == "dspark_v32k_k7" and "over_target_step" in r:
            key = f"vllm034_round_over_step_b{r['batch']}"
            s[key], s[f"{key}_source"] = round(r["over_target_step"], 3), src
    if d["decode_full_graph_share_min"] is not None:
        s["vllm034_decode_full_graph_share"] = d["decode_full_graph_share_min"]
        s["vllm034_decode_full_graph_share_source"] = src
    summary.write_text(json.dumps(s, indent=2) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--summary", type=Path)
    args = ap.parse_args(argv)
    d = derive(args.folder)
    if not d["rows"]:
        print(f"no finished configuration under {args.folder}", file=sys.stderr)
        return 1
    out = args.folder / "round_dispatch.json"
    out.write_text(json.dumps(d, indent=2) + "\n")
    print_table(d)
    if args.summary:
        merge_summary(d, args.summary, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
