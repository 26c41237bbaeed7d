#!/usr/bin/env bash
# A stage that starts another pipeline beside the running one and returns at once: BRANCH's stages
# (lab/gpu/BRANCH.stages) run in the background, their logs and stages.txt in $RES/BRANCH, so
# work that needs no quiet GPU (training an ablation, an acceptance gate) overlaps work that does not
# mind sharing. Order the two with wait_stage.sh stages on either side.
#   start_pipeline.sh BRANCH
set -euo pipefail; cd "$(dirname "$0")/../.."
BRANCH="${1:?usage: start_pipeline.sh BRANCH (a lab/gpu/BRANCH.stages file)}"
[ -f "lab/gpu/$BRANCH.stages" ] || { echo "no lab/gpu/$BRANCH.stages" >&2; exit 2; }
ROOT="${RES:-/tmp/dspark-res}"
# The branch runs in this checkout (WORK=$PWD: run_all copies nothing) and knows the root's results.
(RES="$ROOT/$BRANCH" WORK="$PWD" PIPELINE_ROOT="$ROOT" setsid nohup bash lab/gpu/run_all.sh \
  "$BRANCH" >/dev/null 2>&1 </dev/null &)
echo "started $BRANCH: results in $ROOT/$BRANCH"
