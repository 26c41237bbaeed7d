#!/usr/bin/env bash
# One device call of a session, whichever call it is: take in the carry folders this call brought,
# write the session's deadline if no earlier call did, install vLLM 0.26 in the call that brings its
# last part (.c4), and start the pipeline if no earlier call did.
#   bash scripts/gpu/session.sh PIPELINE [--budget SECONDS]    (default 1560: 30 minutes less the
#                                       machine's start, about 180 s on 2026-12-05, and a margin)
# Every call of a batch runs the same line with its own carry, so a call that gets no machine
# costs only what it carried: on 2026-12-05 the first call of a batch (the one that started the
# pipeline) got no machine, the second got a fresh one, and the pipeline never ran. Stages wait for
# what later calls bring (the target for its GGUF parts, vLLM stages for /tmp/vsite/.ready).
# Send call 1 alone and the rest as a batch once it has a machine: after a call gets none, every
# call for the next ~10 minutes is refused at 15 s of device time each (2026-12-05: 241 s lost).
# Where things go: .whl -> /tmp/carry/.whl; .gg1/.gg2/.data/.rg/.dr1/.dr2 files -> /tmp/carry;
# vLLM 0.26's .c1a/.c1b/.c2a/.c2b/.c3/.c4 -> /tmp/vx. A file already there is never rewritten (a
# stage may be reading it): carry a folder in two calls and the second copy is a no-op.
set -uo pipefail; cd "$(dirname "$0")/../.."
PIPELINE="${1:?usage: session.sh PIPELINE [--budget SECONDS]}"; shift
BUDGET=1560
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) BUDGET=$2; shift 2 ;;
    *) echo "session.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -f "scripts/gpu/$PIPELINE.stages" ] || { echo "session.sh: no scripts/gpu/$PIPELINE.stages" >&2; exit 2; }
CARRY="${CARRY_DIR:-/tmp/carry}" VX="${VX_DIR:-/tmp/vx}" RES="${RES:-/tmp/dspark-res}"
DEADLINE="${DEADLINE_FILE:-/tmp/dspark-deadline}" STARTED="${STARTED_DIR:-/tmp/dspark-started}"
mkdir -p "$CARRY" "$VX"
[ -f "$DEADLINE" ] || echo $(($(date +%s) + BUDGET)) >"$DEADLINE"
took=()
take() {  # take DEST FOLDER: each entry of FOLDER into DEST under a temporary name, then renamed,
  # so a stage that sees a name sees the whole file; an entry DEST already holds is left alone
  local dest=$1 dir=$2 f
  [ -d "$dir" ] || return 0
  for f in "$dir"/*; do
    local name; name=$(basename "$f")
    [ -e "$dest/$name" ] && continue
    cp -r "$f" "$dest/.part.$name" && mv "$dest/.part.$name" "$dest/$name" || return 1
  done
  took+=("$dir")
}
[ ! -d .whl ] || [ -e "$CARRY/.whl" ] || { cp -r .whl "$CARRY/.part.whl" && mv "$CARRY/.part.whl" "$CARRY/.whl" && took+=(.whl); }
for d in .gg1 .gg2 .data .rg .dr1 .dr2; do take "$CARRY" "$d"; done
for d in .c1a .c1b .c2a .c2b .c3 .c4; do take "$VX" "$d"; done
echo "session.sh: took ${took[*]:-nothing}; $(( $(cat "$DEADLINE") - $(date +%s) )) s to the deadline"
rc=0
if [ -d .c4 ] && [ ! -f /tmp/vsite/.ready ]; then bash scripts/gpu/vllm_install.sh || rc=1; fi
if mkdir "$STARTED" 2>/dev/null; then
  (setsid nohup bash scripts/gpu/run_all.sh "$PIPELINE" >/dev/null 2>&1 </dev/null &)
  echo "session.sh: started $PIPELINE"
else
  echo "session.sh: $PIPELINE was started by an earlier call"
fi
exit $rc
