#!/usr/bin/env bash
# The trainer step at the SmolLM2-135M shape with more tokens per step (#16's goal: >= 400k target
# tokens/s; 385.7k measured on 2026-12-05 at 64 x 1,024 tokens, GPU busy 84.5%, the host's launches
# the rest). The fastest variant of that run (compiled target and loss) at ROWS rows of 1,024 tokens
# each (default 64 128 256), the loss chunk growing with the rows (launches per step about
# constant), in one run so the rows compare as ratios, under a 150-s cap (on 2026-12-05 a fresh
# H200 finished the 64- and 128-row rows in it and the cap cut the 256-row one). Carry .whl:
#   bash lab/gpu/train_smollm2_batch.sh [ROWS...]   -> $OUT/train_smollm2_batch.{json,log}
set -uo pipefail; cd "$(dirname "$0")/../.."
V=fused_flex_tflex_compile_tcompile_lcompile ROWS=("$@") VARIANTS=()
[ $# -gt 0 ] || ROWS=(64 128 256)
for r in "${ROWS[@]}"; do
  [[ "$r" =~ ^[1-9][0-9]*$ ]] || { echo "train_smollm2_batch.sh: ROWS are row counts, got $r" >&2; exit 2; }
  VARIANTS+=("$V+loss.chunk_tokens=$((r * 128))+trainer.micro_batch_size=$r")
done
source lab/gpu/env.sh
timeout -k 10 150 python3 scripts/bench_train.py --json "$OUT/train_smollm2_batch.json" \
  step8b --shape smollm2_135m --steps 5 --keep-going --variants "${VARIANTS[@]}" 2>&1 |
  grep -v "it/s\]" | tee "$OUT/train_smollm2_batch.log" | tail -12
