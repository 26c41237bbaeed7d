#!/usr/bin/env bash
# Run CI (.ci/run) the way the CI machine does: on a fresh clone of a commit, with its own venvs.
# The clone (about 6.5 GB once its two venvs are built) is removed on exit, pass or fail; only the
# log stays. Clones left behind by hand once filled the disk and failed a real CI run.
# .ci/run runs in a process group of its own: on exit, or when this script is killed (TERM, INT),
# the whole group is stopped before the clone is removed, so no test can write into it after.
#
# Usage: scripts/ci_clean_clone.sh [COMMIT] [LOG]      (defaults: HEAD, /tmp/ci_clean_clone.log)
# Exit code: .ci/run's.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT="$(git -C "$REPO" rev-parse "${1:-HEAD}")"
LOG="${2:-/tmp/ci_clean_clone.log}"
WORK="$(mktemp -d /tmp/ci_clone.XXXXXX)"
CI_GROUP=""
stop_group() {  # TERM, then KILL after 10 s, every process .ci/run started
    [[ -n "$CI_GROUP" ]] || return 0
    kill -TERM -- "-$CI_GROUP" 2>/dev/null || return 0
    for _ in $(seq 100); do
        kill -0 -- "-$CI_GROUP" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-$CI_GROUP" 2>/dev/null || true
}
trap 'stop_group; rm -rf "$WORK"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
git clone -q "$REPO" "$WORK/main"
git -C "$WORK/main" checkout -q "$COMMIT"
echo "[ci_clean_clone] $COMMIT in $WORK; $(df -h --output=avail "$WORK" | tail -1 | tr -d ' ') free; log $LOG"
set +e
# Not a group leader (no job control here), so setsid makes this very process the group's leader.
(cd "$WORK/main" && exec setsid bash .ci/run) > "$LOG" 2>&1 &
CI_GROUP=$!
wait "$CI_GROUP"
rc=$?
set -e
echo "[ci_clean_clone] .ci/run exit $rc after $SECONDS s (log $LOG)"
exit $rc
