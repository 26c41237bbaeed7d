#!/usr/bin/env bash
# One device call of a session, whichever call it is: join the files whose pieces this call
# brought (a .kN folder of lab/gpu/carry_pieces.py pack), write the session's deadline if no
# earlier call did, install vLLM 0.26 once all of its files are in, and start the pipeline if no
# earlier call did.
#   bash lab/gpu/session.sh PIPELINE [--budget SECONDS]    (default 1560: 30 minutes less the
#                                       machine's start, about 180 s on 2026-12-05, and a margin)
# Every call of a batch runs the same line with its own carry, so a call that gets no machine
# costs only what it carried: on 2026-12-05 the first call of a batch (the one that started the
# pipeline) got no machine, the second got a fresh one, and the pipeline never ran. Stages wait for
# what later calls bring (the target for its GGUF, vLLM stages for /tmp/vsite/.ready).
# Send call 1 alone and the rest as a batch once it has a machine: after a call gets none, every
# call for the next ~10 minutes is refused at 15 s of device time each (2026-12-05: 241 s lost).
# Where things go: a file packed for `carry` -> /tmp/carry (`carry/.whl` -> /tmp/carry/.whl, whole),
# for `vx` -> /tmp/vx (vLLM's parts); each appears under its name only once whole and checked
# (carry_pieces.py), and a file already there is never rewritten (a stage may be reading it).
set -uo pipefail; cd "$(dirname "$0")/../.."
PIPELINE="${1:?usage: session.sh PIPELINE [--budget SECONDS]}"; shift
BUDGET=1560
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) BUDGET=$2; shift 2 ;;
    *) echo "session.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -f "lab/gpu/$PIPELINE.stages" ] || { echo "session.sh: no lab/gpu/$PIPELINE.stages" >&2; exit 2; }
CARRY="${CARRY_DIR:-/tmp/carry}" VX="${VX_DIR:-/tmp/vx}" RES="${RES:-/tmp/dspark-res}"
DEADLINE="${DEADLINE_FILE:-/tmp/dspark-deadline}" STARTED="${STARTED_DIR:-/tmp/dspark-started}"
mkdir -p "$CARRY" "$VX"
[ -f "$DEADLINE" ] || echo $(($(date +%s) + BUDGET)) >"$DEADLINE"
took=() rc=0
for d in .k[0-9]*; do
  [ -f "$d/carry.json" ] || continue
  CARRY_DIR="$CARRY" VX_DIR="$VX" python3 lab/gpu/carry_pieces.py join "$d" || rc=1
  took+=("$d")
done
echo "session.sh: took ${took[*]:-nothing}; $(( $(cat "$DEADLINE") - $(date +%s) )) s to the deadline"
if [ ! -f /tmp/vsite/.ready ] && VX_DIR="$VX" python3 lab/gpu/carry_pieces.py complete vx; then
  bash lab/gpu/vllm_install.sh || rc=1
fi
if mkdir "$STARTED" 2>/dev/null; then
  (setsid nohup bash lab/gpu/run_all.sh "$PIPELINE" >/dev/null 2>&1 </dev/null &)
  echo "session.sh: started $PIPELINE"
else
  echo "session.sh: $PIPELINE was started by an earlier call"
fi
exit $rc
