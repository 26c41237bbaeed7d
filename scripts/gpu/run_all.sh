#!/usr/bin/env bash
# Issues 7 and 9 as one detached pipeline on one GPU machine, so no stage depends on the device
# tool's 10-minute call limit. Start it, then watch it with poll.sh (each poll returns results):
#   setsid nohup bash scripts/gpu/run_all.sh >/dev/null 2>&1 </dev/null &
# Stages (logs and results in $RES, default /tmp/dspark-res; stages.txt has times and exit codes):
#   target   issue7_1_target.sh   the ~160M small target (artifacts/small-target)
#   distill  issue7_2_distill.sh  DSpark and DFlash drafts against it, same data/steps/seed
#   measure  issue7_3_measure.sh  realized acceptance, e2e speed-up, training tokens/s + MFU
#   vllm     issue9_vllm.sh       real vLLM vs our engine (waits for vllm_install.sh's marker)
#   speed    bench_speed.sh       stage speeds at Qwen3-8B draft sizes
# The repo is copied to $WORK first: later device calls re-sync the checkout under it.
set -uo pipefail
RES="${RES:-/tmp/dspark-res}"; WORK="${WORK:-/tmp/dspark-repo}"
mkdir -p "$RES" "$WORK"
tar --exclude='./.c?' --exclude=./.git -cf - . | tar -xf - -C "$WORK"
cd "$WORK" && export OUT="$RES" && source scripts/gpu/env.sh
stage() {  # stage NAME SCRIPT: run it, log to $RES/NAME.log, record times and exit code
  echo "$(date +%T) start $1" >>"$RES/stages.txt"
  bash "scripts/gpu/$2" >"$RES/$1.log" 2>&1; local rc=$?
  echo "$(date +%T) end $1 rc=$rc" >>"$RES/stages.txt"
}
stage target issue7_1_target.sh
stage distill issue7_2_distill.sh
stage measure issue7_3_measure.sh
stage vllm issue9_vllm.sh
stage speed bench_speed.sh
touch "$RES/DONE"
