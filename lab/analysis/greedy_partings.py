"""Re-score, on CPU in float64, where a saved vLLM-vs-engine gate report's greedy runs part.

    python lab/analysis/greedy_partings.py REPORT.json --target DIR --num-prompts N \
        --prompts sharegpt=FILE humaneval=FILE [--out FILE]

Rebuilds the gate's prompts exactly as lab/gpu/vllm_vs_engine.py did (same files, count and
length cap), then runs its `greedy_partings`: the engine's T=0 outputs against HF's greedy ones
and vLLM DSpark's against vLLM's target-only run, for a report written before the gate kept the
first, or to check the second off the GPU. Prints and writes (--out) both lists, under the
report's own keys.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.gpu.vllm_vs_engine import greedy_partings, prompts_of  # noqa: E402
from scripts.eval_acceptance import parse_prompt_files  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--num-prompts", type=int, required=True)
    ap.add_argument("--prompts", nargs="+", help="NAME=FILE, as the gate was given them")
    ap.add_argument("--max-prompt-tokens", type=int, default=768)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    r = json.loads(a.report.read_text())
    files = parse_prompt_files(a.prompts)
    prompts = prompts_of(a.target, a.num_prompts, files, a.max_prompt_tokens)
    if len(prompts) != r["num_prompts"]:
        raise SystemExit(f"{len(prompts)} prompts rebuilt, the report has {r['num_prompts']}")
    out = {"report": str(a.report), **greedy_partings(r, prompts, a.target, "cpu")}
    for name in ("engine_greedy_partings", "vllm_greedy_partings"):
        for p in out[name]:
            print(name, json.dumps(p))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
