#!/usr/bin/env bash
# The README's test command. Installs what the tests need, then runs: ruff, the CPU test suite,
# the vLLM-compatibility suite in its own virtual environment (scripts/test_vllm.sh), so the
# main environment never holds vLLM, and the interoperability suite in another (scripts/
# test_interop.sh). Fails on the first failing step.
#
# The two venvs build in the background while ruff and the CPU suite run (their builds are mostly
# downloads and disk writes, and the CPU suite keeps about one of two cores busy). Each build
# writes its own log, shown whole once the CPU suite is done; a failed build fails this script
# there, before any suite runs in a venv. Each step prints the seconds it took ("[test] ...").
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
# The two venvs below take about 6 GB; a full disk shows up late, as a pip OSError.
echo "[test] $(df -h --output=avail . | tail -1 | tr -d ' ') free on this disk (the venvs need about 6 GB)"
t=$SECONDS
took() {  # took WHAT: the seconds since the last step ended
    echo "[test] $1 took $((SECONDS - t)) s"
    t=$SECONDS
}
# torch first, pinned: the CPU wheel on disk. An unpinned resolve would pull a multi-GB CUDA build.
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[dev]"
took "installing the main environment"

# The venv builds, one after the other (each installs this repo editable: not two at once), in
# the background. stop_tree ends them if this script exits early (ruff or the CPU suite failed).
BUILD_LOGS="$(mktemp -d)"
BUILDS=""
stop_tree() {  # stop_tree PID: PID and every process below it (each paused before its children
    local child  # are listed, so none starts another meanwhile)
    kill -STOP "$1" 2>/dev/null || return 0
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        stop_tree "$child"
    done
    kill -TERM "$1" 2>/dev/null || true
    kill -CONT "$1" 2>/dev/null || true
}
cleanup() {
    if [[ -n "$BUILDS" ]] && kill -0 "$BUILDS" 2>/dev/null; then
        echo "[test] stopping the venv builds (this script is exiting early)" >&2
        stop_tree "$BUILDS"
        wait "$BUILDS" 2>/dev/null || true
    fi
    rm -rf "$BUILD_LOGS"
}
trap cleanup EXIT
(
    for suite in vllm interop; do
        rc=0
        bash "scripts/test_$suite.sh" --build-only > "$BUILD_LOGS/$suite.log" 2>&1 || rc=$?
        echo "$rc" > "$BUILD_LOGS/$suite.rc"
    done
) &
BUILDS=$!
echo "[test] building .venv-vllm and .venv-interop in the background (logs shown after the CPU suite)"

python3 -m ruff check .
python3 -m ruff format --check .
took "ruff"
# vLLM 0.34 source files and Triton's CPU interpreter for the oracle tests (ignored folder).
bash scripts/fetch_vllm_oracle.sh || echo "[test] vLLM oracle files unavailable: the oracle tests skip"
took "fetching the vLLM oracle files"
python3 -m pytest -m "not vllm" -p no:cacheprovider -o addopts="" -q
took "the CPU suite"

wait "$BUILDS" || true
BUILDS=""
took "waiting for the venv builds"
for suite in vllm interop; do
    echo "[test] --- the $suite venv build's log ---"
    cat "$BUILD_LOGS/$suite.log" 2>/dev/null || true
    rc="$(cat "$BUILD_LOGS/$suite.rc" 2>/dev/null || echo "none")"
    if [[ "$rc" != "0" ]]; then
        echo "[test] FAIL: building the $suite venv (scripts/test_$suite.sh --build-only) exited $rc" >&2
        exit 1
    fi
done
bash scripts/test_vllm.sh
took "the vLLM suite"
bash scripts/test_interop.sh
took "the interop suite"
