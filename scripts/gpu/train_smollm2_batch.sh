#!/usr/bin/env bash
# The trainer step at the SmolLM2-135M shape with more tokens per step (#16's goal: >= 400k target
# tokens/s; 385.7k measured on 2026-12-05 at 64 x 1,024 tokens, GPU busy 84.5%, the host's launches
# the rest). The fastest variant of that run (compiled target and loss) at 64, 128 and 256 rows of
# 1,024 tokens, the loss chunk growing with the rows (launches per step about constant), in one run
# so the rows compare as ratios, under a 150-s cap (on 2026-12-05 a fresh H200 finished the 64- and
# 128-row rows in it and the cap cut the 256-row one; bench_8b.sh's train_smollm2 stage now has
# the first two). Carry .whl:
#   bash scripts/gpu/train_smollm2_batch.sh        -> $OUT/train_smollm2_batch.{json,log}
set -uo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
V=fused_flex_tflex_compile_tcompile_lcompile
timeout -k 10 150 python3 scripts/bench_train.py --json "$OUT/train_smollm2_batch.json" \
  step8b --shape smollm2_135m --steps 5 --keep-going \
  --variants "$V+loss.chunk_tokens=8192+trainer.micro_batch_size=64" \
  "$V+loss.chunk_tokens=16384+trainer.micro_batch_size=128" \
  "$V+loss.chunk_tokens=32768+trainer.micro_batch_size=256" 2>&1 | grep -v "it/s\]" | tee "$OUT/train_smollm2_batch.log" | tail -12
