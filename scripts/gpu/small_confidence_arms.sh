#!/usr/bin/env bash
# Small target: the confidence_detach ablation (configs/experiment/small_gpu_conf_{detached,end_to_end}
# .yaml: small_gpu's target, data, steps and seed, only loss.confidence_detach differs). Each arm is
# distilled, then calibrated (`train.publish.calibrate`: held-out ECE of the raw head, "before", and after STS).
# Needs artifacts/small-target (small_target.sh). Held-out tau and per-position acceptance are in each
# arm's summary.json.
set -uo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
rc=0
for e in small_gpu_conf_detached small_gpu_conf_end_to_end; do
  python3 -m train.distill +experiment=$e overwrite=true trainer.progress=false 2>&1 \
    | grep --line-buffered -v "it/s\|examples/s" >"$OUT/$e.log" || rc=1
  cp outputs/$e/summary.json "$OUT/$e.summary.json" || rc=1
  python3 -m train.publish.calibrate outputs/$e/final --target artifacts/small-target \
    >"$OUT/$e.calibrate.log" 2>&1 || rc=1
  tail -3 "$OUT/$e.log"; tail -8 "$OUT/$e.calibrate.log"
done
exit $rc
