#!/usr/bin/env bash
# The README's test command. Installs what the tests need, then runs: ruff, the CPU test suite,
# the vLLM-compatibility suite in its own virtual environment (scripts/test_vllm.sh), so the
# main environment never holds vLLM, and the interoperability suite in another (scripts/
# test_interop.sh). Fails if any step fails: at once for the main environment, ruff and the CPU
# suite; for the venv steps once the CPU suite is done.
#
# The venv suites run in the background while ruff and the CPU suite run, one step after another:
# build .venv-vllm, build .venv-interop, the vLLM suite, the interop suite. Their output goes to one
# log, shown whole once the CPU suite is done and then live to its end; a failed build or suite
# fails this script there (a failed build skips its suite). The CPU suite runs on two pytest-xdist
# workers, each test file whole on one worker (its module fixtures built once), one torch thread
# per worker (tests/conftest.py). Each step prints the seconds it took ("[test] ...",
# "[test_vllm] ...", "[test_interop] ...").
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

# The background steps. Each venv build installs this repo editable: never two at once. stop_tree
# ends them if this script exits early (ruff or the CPU suite failed, or it was interrupted).
BG_DIR="$(mktemp -d)"
BG=""
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
    if [[ -n "$BG" ]] && kill -0 "$BG" 2>/dev/null; then
        echo "[test] stopping the background steps (this script is exiting early)" >&2
        stop_tree "$BG"
        wait "$BG" 2>/dev/null || true
    fi
    rm -rf "$BG_DIR"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
BG_STEPS=("test_vllm.sh --build-only" "test_interop.sh --build-only" "test_vllm.sh" "test_interop.sh")
: > "$BG_DIR/log"
(
    failed_builds=""
    for i in "${!BG_STEPS[@]}"; do
        read -ra cmd <<< "${BG_STEPS[$i]}"
        rc=0
        if [[ " $failed_builds " == *" ${cmd[0]} "* ]]; then
            rc="skipped (its venv build failed)"
        else
            bash "scripts/${cmd[0]}" "${cmd[@]:1}" >> "$BG_DIR/log" 2>&1 || rc=$?
            [[ $rc == 0 ]] || failed_builds+=" ${cmd[0]}"
        fi
        echo "$rc" > "$BG_DIR/$i.rc"
    done
) &
BG=$!
echo "[test] in the background: ${BG_STEPS[*]/#/scripts/} (log shown after the CPU suite)"

python3 -m ruff check .
python3 -m ruff format --check .
took "ruff"
# vLLM 0.34 source files and Triton's CPU interpreter for the oracle tests (ignored folder).
bash scripts/fetch_vllm_oracle.sh || echo "[test] vLLM oracle files unavailable: the oracle tests skip"
took "fetching the vLLM oracle files"
python3 -m pytest -m "not vllm" -p no:cacheprovider -o addopts="" -q -n 2 --dist loadfile
took "the CPU suite"

echo "[test] --- the background steps' log (live from here) ---"
tail -n +1 -f --pid="$BG" "$BG_DIR/log"
wait "$BG" || true
BG=""
took "the rest of the background steps"
failed=0
for i in "${!BG_STEPS[@]}"; do
    rc="$(cat "$BG_DIR/$i.rc" 2>/dev/null || echo "never ran")"
    if [[ "$rc" != "0" ]]; then
        [[ "$rc" =~ ^[0-9]+$ ]] && rc="exit $rc"
        echo "[test] FAIL: scripts/${BG_STEPS[$i]} (in the background): $rc" >&2
        failed=1
    fi
done
exit $failed
