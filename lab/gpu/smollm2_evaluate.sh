#!/usr/bin/env bash
# SmolLM2, stage 4 (~2 min a draft): realized acceptance with the embedded engine, T=0 and T=1, on
# held-out ShareGPT prompts and HumanEval (the target answers; 256 new tokens).
#   bash lab/gpu/smollm2_evaluate.sh [--temperatures T...] [--domain NAME=FILE]... [NAME=DRAFT_DIR...]
# --temperatures (default 0 1): e.g. 0 alone halves the stage where a session's minutes are short.
# --domain NAME=FILE (repeatable; default the held-out ShareGPT and HumanEval prompts): the prompt
#   sets, e.g. sharegpt_read=artifacts/smollm2-data/sharegpt-train.jsonl, prompts whose answers
#   the drafts trained on (the first 96 rows of each file).
# Default: DSpark vs DFlash at equal budget (dspark=outputs/smollm2_dspark/final
# dflash=outputs/smollm2_dflash/final); the JSON is named after the drafts, e.g.
# smollm2_dspark_vs_dflash.json, smollm2_dspark.json for one.
set -euo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
D=artifacts/smollm2-data
TEMPS=(0 1)
if [ "${1:-}" = --temperatures ]; then
  shift; TEMPS=()
  while [ $# -gt 0 ] && [[ "$1" != *=* && "$1" != --* ]]; do TEMPS+=("$1"); shift; done
  [ ${#TEMPS[@]} -gt 0 ] || { echo "smollm2_evaluate.sh: --temperatures needs a value" >&2; exit 2; }
fi
DOMAINS=()
while [ "${1:-}" = --domain ]; do DOMAINS+=("$2"); shift 2; done
[ ${#DOMAINS[@]} -gt 0 ] || DOMAINS=(sharegpt=$D/sharegpt-heldout.jsonl humaneval=$D/humaneval-heldout.jsonl)
DRAFTS=("$@"); [ $# -gt 0 ] || DRAFTS=(dspark=outputs/smollm2_dspark/final dflash=outputs/smollm2_dflash/final)
# A draft whose training failed is left out (named on stderr), so the others are still measured.
KEPT=()
for d in "${DRAFTS[@]}"; do
  if [ -f "${d#*=}/config.json" ]; then KEPT+=("$d"); else echo "smollm2_evaluate.sh: no draft at ${d#*=}, left out" >&2; fi
done
[ ${#KEPT[@]} -gt 0 ] || { echo "smollm2_evaluate.sh: no draft to evaluate" >&2; exit 2; }
DRAFTS=("${KEPT[@]}")
NAMES=("${DRAFTS[@]%%=*}"); NAME="smollm2_${NAMES[0]}"
for n in "${NAMES[@]:1}"; do NAME+="_vs_$n"; done
python3 scripts/eval_acceptance.py --target artifacts/smollm2-135m-instruct --device cuda \
  "${DRAFTS[@]/#/--draft=}" \
  --prompts "${DOMAINS[@]}" \
  --temperatures "${TEMPS[@]}" --num-prompts 96 --max-tokens 256 --batch 32 --json "$OUT/$NAME.json"
