#!/usr/bin/env bash
# Small target, stage 2 (~4 min): DSpark and DFlash drafts against the small target, same data, steps
# and seed (configs/experiment/small_gpu*.yaml); metrics and summaries to $OUT.
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
for e in small_gpu small_gpu_dflash; do
  python3 -m train.distill +experiment=$e overwrite=true trainer.progress=false "$@" \
    2>&1 | grep --line-buffered -v "it/s\|examples/s" | tee "$OUT/$e.log"
  cp outputs/$e/metrics.jsonl "$OUT/$e.metrics.jsonl"; cp outputs/$e/summary.json "$OUT/$e.summary.json"
done
