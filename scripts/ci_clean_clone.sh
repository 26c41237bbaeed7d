#!/usr/bin/env bash
# Run CI (.ci/run) the way the CI machine does: on a fresh clone of a commit, with its own venvs.
# The clone (about 6.5 GB once its two venvs are built) is removed on exit, pass or fail; only the
# log stays. Clones left behind by hand once filled the disk and failed a real CI run.
#
# Usage: scripts/ci_clean_clone.sh [COMMIT] [LOG]      (defaults: HEAD, /tmp/ci_clean_clone.log)
# Exit code: .ci/run's.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT="$(git -C "$REPO" rev-parse "${1:-HEAD}")"
LOG="${2:-/tmp/ci_clean_clone.log}"
WORK="$(mktemp -d /tmp/ci_clone.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
git clone -q "$REPO" "$WORK/main"
git -C "$WORK/main" checkout -q "$COMMIT"
# The CI machine has ../shared beside the checkout; so does a clone here.
if [[ -d "$REPO/../shared" ]]; then
    ln -s "$(cd "$REPO/../shared" && pwd)" "$WORK/shared"
fi
echo "[ci_clean_clone] $COMMIT in $WORK; $(df -h --output=avail "$WORK" | tail -1 | tr -d ' ') free; log $LOG"
set +e
(cd "$WORK/main" && bash .ci/run) > "$LOG" 2>&1
rc=$?
set -e
echo "[ci_clean_clone] .ci/run exit $rc after $SECONDS s (log $LOG)"
exit $rc
