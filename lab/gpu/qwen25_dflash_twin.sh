#!/usr/bin/env bash
# Issue 56, item 6: DSpark against DFlash at equal budget on Qwen2.5-Coder-1.5B-Instruct, after the
# recipe's distill stage. The DFlash twin runs the DSpark draft's own command (the recipe's
# distill/done.json) with +experiment=qwen25_coder_1p5b_dflash, its output in distill_dflash/run,
# trainer.max_seconds=0 and trainer.max_steps = the steps the DSpark run made (its summary.json):
# the same rows, steps, seed, layers and draft vocabulary, its schedule planned over those steps.
# Then serve.evaluate on the test split with both drafts, DFlash first (so the DSpark row's
# `vs_first` is DSpark over DFlash with its paired 95% interval), T=0 and T=1, EVAL_PROMPTS
# prompts a domain, EVAL_TOKENS new tokens; eval.json keeps the per-position decomposition.
# Criterion, the issue's, fixed before any run: dspark_over_dflash_t0_code >= 1.15.
#   bash lab/gpu/qwen25_dflash_twin.sh        (a stage line `dflash_twin qwen25_dflash_twin.sh`)
set -uo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
R="${RECIPE_OUT:-artifacts/recipes/qwen2.5-coder-1.5b-instruct}"
EVAL_PROMPTS="${EVAL_PROMPTS:-64}" EVAL_TOKENS="${EVAL_TOKENS:-256}"
[ -f "$R/distill/done.json" ] || { echo "no finished distill stage in $R" >&2; exit 2; }
mapfile -t CMD < <(python3 - "$R" <<'PY'
import json, sys
from pathlib import Path

r = Path(sys.argv[1])
cmd = json.loads((r / "distill" / "done.json").read_text())["commands"][-1]
steps = json.loads((r / "distill" / "run" / "summary.json").read_text())["step"]
assert "+experiment=qwen25_coder_1p5b" in cmd, cmd
out = []
for a in cmd[1:]:  # [python, -m, train.distill, ...]: this machine's python3 runs it
    if a == "+experiment=qwen25_coder_1p5b":
        a = "+experiment=qwen25_coder_1p5b_dflash"
    elif a.startswith("output_dir="):
        a = f"output_dir={r / 'distill_dflash' / 'run'}"
    elif a.startswith(("trainer.max_seconds=", "trainer.max_steps=")):
        continue
    out.append(a)
print("\n".join([*out, "trainer.max_seconds=0", f"trainer.max_steps={steps}"]))
PY
)
[ ${#CMD[@]} -gt 2 ] || exit 1
echo "DFlash twin: python3 ${CMD[*]}"
python3 "${CMD[@]}" || exit 1
mkdir -p "$OUT/dspark_vs_dflash"
cp "$R/distill_dflash/run/metrics.jsonl" "$OUT/dspark_vs_dflash/metrics_dflash.jsonl"
cp "$R/distill/run/metrics.jsonl" "$OUT/dspark_vs_dflash/metrics_dspark.jsonl"
python3 -m serve.evaluate --target "$R/target/model" \
  --draft "dflash=$R/distill_dflash/run/final" --draft "dspark=$R/distill/run/final" \
  --prompts "code=$R/prompts/test.code.jsonl" "chat=$R/prompts/test.chat.jsonl" \
  --out "$OUT/dspark_vs_dflash" --temperatures 0 1 --max-new-tokens "$EVAL_TOKENS" \
  --max-prompts "$EVAL_PROMPTS" --seed 0
