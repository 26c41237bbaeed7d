#!/usr/bin/env bash
# SmolLM2, between mixing and training: the mixed train rows with each answer cut after its first
# repeated 16-gram (train/prepare/trim_repeats.py), as artifacts/smollm2-data/train.trim.jsonl for
# smollm2_dspark_16k_trim; the counts go to $OUT.
#   bash scripts/gpu/smollm2_trim.sh [SOURCE]    (default train.mix.jsonl, under artifacts/smollm2-data)
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
D=artifacts/smollm2-data
python3 -m train.prepare.trim_repeats "$D/${1:-train.mix.jsonl}" "$D/train.trim.jsonl" \
  --target artifacts/smollm2-135m-instruct
cp "$D/train.trim.jsonl.summary.json" "$OUT/"
