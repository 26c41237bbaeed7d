#!/usr/bin/env bash
# Small target, stage 1 (~4 min): build the ~160M "small" Qwen3 target on the GPU (same tokenizer/chat
# recipe as the tiny one; the preset stops after 8 passes over the corpus, where held-out loss
# stops improving) into artifacts/small-target, kept on the machine for the later stages.
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
python3 scripts/make_tiny_target.py --preset small --device cuda --minutes 7 \
  --out artifacts/small-target 2>&1 | tee "$OUT/small_target.log"
cp artifacts/small-target/train_summary.json "$OUT/small_target_summary.json"
