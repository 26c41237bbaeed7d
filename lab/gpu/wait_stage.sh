#!/usr/bin/env bash
# A stage that waits until another pipeline's stage has ended (whatever its exit code) or the
# pipeline is DONE: the way a main pipeline and a branch (start_pipeline.sh) take turns on the GPU.
#   wait_stage.sh [BRANCH/]STAGE [MINUTES]     STAGE "DONE": the whole pipeline
# Paths are under the main pipeline's results ($PIPELINE_ROOT in a branch, else $RES). Exit 1 on timeout
# (default 30 min), so stages.txt shows that the wait, not the work, ran out.
set -uo pipefail
SPEC="${1:?usage: wait_stage.sh [BRANCH/]STAGE [MINUTES]}"; MINUTES="${2:-30}"
ROOT="${PIPELINE_ROOT:-${RES:-/tmp/dspark-res}}"
case "$SPEC" in */*) DIR="$ROOT/${SPEC%/*}" STAGE="${SPEC##*/}" ;; *) DIR="$ROOT" STAGE="$SPEC" ;; esac
done_yet() {
  if [ "$STAGE" = DONE ]; then [ -f "$DIR/DONE" ]; else grep -q " end $STAGE rc=" "$DIR/stages.txt" 2>/dev/null; fi
}
end=$((SECONDS + 60 * MINUTES))
until done_yet; do
  [ $SECONDS -lt $end ] || { echo "$SPEC did not end within $MINUTES min" >&2; exit 1; }
  sleep 5
done
grep " end $STAGE rc=" "$DIR/stages.txt" 2>/dev/null | tail -1; echo "$SPEC has ended"
