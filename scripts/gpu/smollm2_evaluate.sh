#!/usr/bin/env bash
# SmolLM2, stage 4 (~2 min): realized acceptance with the embedded engine, DSpark vs DFlash, T=0 and
# T=1, on held-out ShareGPT prompts and HumanEval (the target answers; 256 new tokens).
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
D=artifacts/smollm2-data
python3 scripts/eval_acceptance.py --target artifacts/smollm2-135m-instruct --device cuda \
  --draft dspark=outputs/smollm2_dspark/final --draft dflash=outputs/smollm2_dflash/final \
  --prompts sharegpt=$D/sharegpt-heldout.jsonl humaneval=$D/humaneval-heldout.jsonl \
  --num-prompts 96 --max-tokens 256 --batch 32 --json "$OUT/smollm2_dspark_vs_dflash.json"
