#!/usr/bin/env bash
# One GPU session's work as a detached pipeline, so no stage depends on the device tool's 10-minute
# call limit. PIPELINE names lab/gpu/PIPELINE.stages: one "NAME SCRIPT [ARGS...]" line per stage
# (small: the ~160M self-trained target; smollm2: SmolLM2-135M-Instruct on ShareGPT). Start it with
#   setsid nohup bash lab/gpu/run_all.sh PIPELINE >/dev/null 2>&1 </dev/null &
# and watch it with poll.sh, which returns what has finished so far. Logs and results collect in
# $RES (default /tmp/dspark-res); stages.txt has each stage's times and exit code. A failed stage
# does not stop the next: each one checks its own inputs.
set -uo pipefail
PIPELINE="${1:?usage: run_all.sh PIPELINE [FIRST_STAGE] (a lab/gpu/PIPELINE.stages file)}"
FIRST="${2:-}"  # resume a pipeline at this stage (earlier stages' outputs are still on the machine)
RES="${RES:-/tmp/dspark-res}"; WORK="${WORK:-/tmp/dspark-repo}"
mkdir -p "$RES" "$WORK"
echo $$ >"$RES/pipeline.pid"  # poll.sh: a poll with no live pipeline returns at once
# The repo is copied first: later device calls re-sync the checkout under the running stages. Started
# from $WORK itself (a committed snapshot unpacked there), nothing is copied.
[ "$PWD" -ef "$WORK" ] || tar --exclude='./.c?' --exclude='./.c??' --exclude='./.gg?' --exclude='./.dr?' --exclude='./.v34_*' --exclude='./.k[0-9]*' --exclude='./.tm_*' --exclude='./.q25s_*' --exclude=./.gguf --exclude=./.git -cf - . | tar -xf - -C "$WORK"
cd "$WORK" && export OUT="$RES" && source lab/gpu/env.sh
while read -r name script args; do
  [ -z "$name" ] || [ "${name:0:1}" = "#" ] && continue
  [ -n "$FIRST" ] && [ "$name" != "$FIRST" ] && continue
  FIRST=""
  echo "$(date +%T) start $name" >>"$RES/stages.txt"
  # shellcheck disable=SC2086
  bash "lab/gpu/$script" $args >"$RES/$name.log" 2>&1; rc=$?
  echo "$(date +%T) end $name rc=$rc" >>"$RES/stages.txt"
done <"lab/gpu/$PIPELINE.stages"
touch "$RES/DONE"
