#!/usr/bin/env bash
# Restart a pipeline at one of its stages on the same machine, after fixing a later stage's script:
#   bash lab/gpu/rerun_from.sh PIPELINE STAGE
# Stops the running pipeline and its stages, keeps the old results in $RES-before-STAGE, and starts
# run_all.sh PIPELINE STAGE detached (earlier stages' outputs stay in $WORK).
RES="${RES:-/tmp/dspark-res}"
stages='python3 (-m (serve.launch|train.distill|train.prepare.regenerate)|scripts/(eval_acceptance|gpu/vllm_vs_engine).py)'
pkill -f "bash lab/gpu/run_all.sh"; pkill -f "$stages"
# SIGTERM lets train.distill save the step under way (train/loop/stop_signals.py): wait for it, up to
# a minute, so the restarted stage never meets a save still being written; then kill what is left.
for _ in $(seq 60); do pgrep -f "$stages" >/dev/null || break; sleep 1; done
pkill -KILL -f "$stages"; sleep 1
old="$RES-before-$2"; rm -rf "$old"; mv "$RES" "$old"; mkdir -p "$RES"
cp "$old"/stages.txt "$RES/stages-before-$2.txt" 2>/dev/null
(setsid nohup bash lab/gpu/run_all.sh "$1" "$2" >/dev/null 2>&1 </dev/null &)
