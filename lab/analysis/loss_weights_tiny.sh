#!/usr/bin/env bash
# Does the CE share of the distillation loss matter for greedy serving? The pinned loss (0.1 CE +
# 0.9 L1, docs/dspark.md) fits the T=1 objective (L1 = total variation = 1 - acceptance at T=1);
# at T=0 a draft token is accepted when it is the target's argmax, which CE on the target's
# distribution trains more directly. Three drafts of the embedded default (`+experiment=tiny`,
# 150 steps, seed 0) on the same data, the tiny target's greedy answers to every train prompt
# (data.regenerate, T=0: the data that served best at T=0 in 779680f:docs/benchmarks.md, "Regeneration
# temperature"): CE/L1 weights 0.1/0.9 (pinned), 0.5/0.5 and 1.0/0.0; then realized acceptance
# with the engine at T=0 and T=1 on held-out code and prose prompts.
# Criterion, fixed before the run: a CE-heavier arm is worth a SmolLM2 run only if its T=0
# acceptance length beats the pinned arm's by >= 5% in both domains.
#   bash lab/analysis/loss_weights_tiny.sh OUT_DIR [SEED [GREEDY_ANSWERS]]   (about 15 minutes on 2 CPU cores)
# SEED (default 0): the drafts' seed. GREEDY_ANSWERS: a regenerated.jsonl an earlier run wrote (the
# greedy answers do not depend on the seed); without it the first arm writes them (7 minutes).
set -euo pipefail; cd "$(dirname "$0")/../.."
OUT=${1:?usage: loss_weights_tiny.sh OUT_DIR [SEED [GREEDY_ANSWERS]]}; mkdir -p "$OUT"
SEED=${2:-0} DATA=${3:-}
COMMON=(+experiment=tiny overwrite=true trainer.progress=false seed=$SEED)
if [ -z "$DATA" ]; then
  python -m train.distill "${COMMON[@]}" experiment_name=ce01 output_dir="$OUT/ce01" \
    data.regenerate.enabled=true data.regenerate.temperature=0 data.regenerate.max_new_tokens=96 \
    >"$OUT/distill_ce01.log" 2>&1
  DATA=$OUT/ce01/regenerated.jsonl ARMS=("ce05 0.5 0.5" "ce10 1.0 0.0")
else
  ARMS=("ce01 0.1 0.9" "ce05 0.5 0.5" "ce10 1.0 0.0")
fi
for arm in "${ARMS[@]}"; do
  read -r name ce l1 <<<"$arm"
  python -m train.distill "${COMMON[@]}" experiment_name=$name output_dir="$OUT/$name" \
    data.train="$DATA" loss.ce_weight=$ce loss.l1_weight=$l1 \
    >"$OUT/distill_$name.log" 2>&1
done
python scripts/eval_acceptance.py --target artifacts/tiny-target --draft ce01="$OUT/ce01/final" \
  --draft ce05="$OUT/ce05/final" --draft ce10="$OUT/ce10/final" --num-prompts 32 --max-tokens 64 \
  --json "$OUT/loss_weights.json" | tee "$OUT/loss_weights.txt"
