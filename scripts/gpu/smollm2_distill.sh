#!/usr/bin/env bash
# SmolLM2, stage 3: DSpark and DFlash at equal budget (configs/experiment/smollm2_*.yaml: same data,
# steps, seed, draft size and draft vocabulary), side by side on the one GPU: each run is mostly
# launch-bound at this size, so two processes finish in about the time of one. Extra args go to both.
set -uo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
for e in smollm2_dspark smollm2_dflash; do
  python3 -m train.distill +experiment=$e overwrite=true trainer.progress=false "$@" \
    >"$OUT/$e.log" 2>&1 &
done
wait; rc=0
for e in smollm2_dspark smollm2_dflash; do
  tail -4 "$OUT/$e.log"
  cp outputs/$e/metrics.jsonl "$OUT/$e.metrics.jsonl" && cp outputs/$e/summary.json "$OUT/$e.summary.json" || rc=1
done
exit $rc
