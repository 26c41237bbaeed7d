#!/usr/bin/env bash
# Restart a pipeline at one of its stages on the same machine, after fixing a later stage's script:
#   bash scripts/gpu/rerun_from.sh PIPELINE STAGE
# Stops the running pipeline and its stages, keeps the old results in $RES-before-STAGE, and starts
# run_all.sh PIPELINE STAGE detached (earlier stages' outputs stay in $WORK).
RES="${RES:-/tmp/dspark-res}"
pkill -f "bash scripts/gpu/run_all.sh" ; pkill -f "python3 -m (serve.launch|train.distill|train.regenerate)"
pkill -f "python3 scripts/(eval_acceptance|gpu/vllm_vs_engine).py"; sleep 2
old="$RES-before-$2"; rm -rf "$old"; mv "$RES" "$old"; mkdir -p "$RES"
cp "$old"/stages.txt "$RES/stages-before-$2.txt" 2>/dev/null
(setsid nohup bash scripts/gpu/run_all.sh "$1" "$2" >/dev/null 2>&1 </dev/null &)
