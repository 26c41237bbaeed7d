#!/usr/bin/env bash
# Does lab/analysis/longer_block_estimate.py foretell a longer block on SmolLM2's own rounds? A pair's
# drafts, trained at block 7, evaluated by the engine at SHORT drafts a round (default 3) and at
# their whole block: the estimate from the short evaluation to 7 beside the ratio measured at 7.
# On the tiny target the estimate from block 7 foretold the trained block 15 within 0.6%
# (779680f:docs/benchmarks.md, "The same pair for 2,000 steps"); there the cap bound little. Here it binds:
# at 3 drafts most rounds of a trained SmolLM2 pair reach the cap.
# Criterion, fixed before its run: the estimate is a fair guide for choosing the block-15 run if,
# on the 2,000-step pair (779680f:docs/benchmarks/smollm2_h100/markov_lr10_vs_dflash_2000_steps_2026-12-06),
# its DSpark / DFlash ratio at 7 drafts from the 3-draft evaluation lies within 2% of the ratio
# measured at 7, on the same 24 held-out ShareGPT prompts (T=0, 256 new tokens).
#   bash lab/analysis/longer_block_check.sh OUT DSPARK_DIR DFLASH_DIR PROMPTS.jsonl [SHORT]
# (this repo's 2-core CPU: about 2-3 minutes an evaluation, four of them)
set -euo pipefail; cd "$(dirname "$0")/../.."
OUT=${1:?usage: longer_block_check.sh OUT DSPARK_DIR DFLASH_DIR PROMPTS.jsonl [SHORT]}
DSPARK=${2:?}; DFLASH=${3:?}; PROMPTS=${4:?}; SHORT=${5:-3}; mkdir -p "$OUT"
for n in "$SHORT" full; do
  spec=(); [ "$n" = full ] || spec=(--num-spec "$n")
  python scripts/eval_acceptance.py --target artifacts/smollm2-135m-instruct \
    --draft dspark="$DSPARK" --draft dflash="$DFLASH" --prompts sharegpt="$PROMPTS" \
    --temperatures 0 --num-prompts 24 --max-tokens 256 --batch 8 --threads 2 \
    ${spec[@]+"${spec[@]}"} --json "$OUT/eval_n$n.json" >"$OUT/eval_n$n.txt" 2>"$OUT/eval_n$n.err"
done
full=$(python -c "import json, sys; print(len(json.load(open(sys.argv[1]))[0]['accepted_per_pos']))" "$OUT/eval_nfull.json")
echo "# estimated from $SHORT drafts a round to $full:"
python lab/analysis/longer_block_estimate.py "$OUT/eval_n$SHORT.json" dspark dflash --block "$full"
echo "# measured at $full:"
python lab/analysis/longer_block_estimate.py "$OUT/eval_nfull.json" dspark dflash --block "$full"
