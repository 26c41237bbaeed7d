#!/usr/bin/env bash
# Small target, stage 3 (~5 min): realized acceptance DSpark vs DFlash (T=0/1, code/prose), end-to-end
# decoding speed-up at batch 1 and 8, training tokens/s + MFU on the small pair.
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
python3 scripts/eval_acceptance.py --target artifacts/small-target --device cuda --batch 16 \
  --draft dspark=outputs/small_gpu/final --draft dflash=outputs/small_gpu_dflash/final \
  --num-prompts 64 --max-tokens 128 --json "$OUT/small_dspark_vs_dflash.json" | tee "$OUT/eval.txt"
python3 scripts/bench_engine.py --device cuda --target artifacts/small-target \
  --checkpoint outputs/small_gpu/final --batch 1 8 --max-tokens 128 | tee "$OUT/engine.txt"
python3 scripts/bench_train.py --json "$OUT/train_step.json" step --gpu --steps 20 \
  --experiment small_gpu | tail -6 | tee "$OUT/train_step.txt"
