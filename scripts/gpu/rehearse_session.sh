#!/usr/bin/env bash
# A device session played on this machine, before its minutes are spent: each of the first CALLS
# packed calls (.k1 ... .kCALLS of `carry_pieces.py pack --pipeline PIPELINE`) runs
# `session.sh PIPELINE` in a folder of its own holding the working tree's tracked files (as edited
# now) and its one .kN, as a device call does, with every device folder redirected under ROOT;
# the pipeline then runs its stages here until STAGE starts, and is stopped there.
#   bash scripts/gpu/rehearse_session.sh PIPELINE CALLS STAGE [ROOT]   (ROOT: /tmp/dspark-rehearsal)
# Stop before the first stage that needs the GPU or vLLM (the stages wait for vLLM, not fail).
# Refused when the calls would complete vLLM's files: session.sh would then install vLLM here.
# Prints the stages that ran and where their logs are (ROOT/res). A stage must read the carries
# from $CARRY_DIR (default /tmp/carry) for this to redirect it.
set -euo pipefail; cd "$(dirname "$0")/../.."
PIPELINE=${1:?usage: rehearse_session.sh PIPELINE CALLS STAGE [ROOT]} CALLS=${2:?CALLS} STAGE=${3:?STAGE}
ROOT=${4:-/tmp/dspark-rehearsal}
[[ "$CALLS" =~ ^[1-9][0-9]*$ ]] || { echo "rehearse_session.sh: CALLS is a count, got $CALLS" >&2; exit 2; }
grep -q "^$STAGE " "scripts/gpu/$PIPELINE.stages" ||
  { echo "rehearse_session.sh: $PIPELINE has no stage $STAGE" >&2; exit 2; }
for i in $(seq "$CALLS"); do
  [ -f ".k$i/carry.json" ] || { echo "no .k$i: carry_pieces.py pack --pipeline $PIPELINE first" >&2; exit 2; }
done
python3 - "$CALLS" <<'PY' || exit 2
import json, sys
calls = int(sys.argv[1])
files = json.load(open(".k1/carry.json"))["files"]
vx = [f for f in files if f["dest"].split("/")[0] == "vx"]
if vx and all(p["call"] <= calls for f in vx for p in f["pieces"]):
    sys.exit(f"rehearse_session.sh: calls 1-{calls} complete vLLM's files; rehearse fewer calls")
PY
rm -rf "$ROOT"; mkdir -p "$ROOT"
export CARRY_DIR=$ROOT/carry VX_DIR=$ROOT/vx RES=$ROOT/res DEADLINE_FILE=$ROOT/deadline \
  STARTED_DIR=$ROOT/started WORK=$ROOT/work PIECES_DIR=$ROOT/pieces
for i in $(seq "$CALLS"); do
  call=$ROOT/call$i; mkdir -p "$call"
  git ls-files -z | tar --null -cf - -T - | tar -xf - -C "$call"
  cp -r ".k$i" "$call/"
  (cd "$call" && bash scripts/gpu/session.sh "$PIPELINE" | grep -v "^  waiting")
done
# session.sh starts run_all.sh under setsid: its process group holds every stage's processes.
for _ in $(seq 720); do
  grep -q " start $STAGE$" "$RES/stages.txt" 2>/dev/null && break
  [ -f "$RES/DONE" ] && break
  [ -f "$RES/pipeline.pid" ] && ! kill -0 "$(cat "$RES/pipeline.pid")" 2>/dev/null && break
  sleep 5
done
[ -f "$RES/pipeline.pid" ] && kill -- -"$(cat "$RES/pipeline.pid")" 2>/dev/null
cat "$RES/stages.txt"; echo "logs: $RES"
grep -q " start $STAGE$" "$RES/stages.txt" && ! grep -q "rc=[1-9]" "$RES/stages.txt"
