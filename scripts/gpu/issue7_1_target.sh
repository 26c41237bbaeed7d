#!/usr/bin/env bash
# Issue 7, call 1 (~8 min): build the ~160M "small" Qwen3 target on the H200 (same tokenizer/chat
# recipe as the tiny one; the preset stops after 8 passes over the corpus) into
# artifacts/small-target, which stays on the machine for the next calls while it is warm.
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
python3 scripts/make_tiny_target.py --preset small --device cuda --minutes 7 \
  --out artifacts/small-target 2>&1 | tail -40 | tee "$OUT/small_target.log"
cp artifacts/small-target/train_summary.json "$OUT/small_target_summary.json"
