#!/usr/bin/env bash
# Run the interoperability suite (tests/interop) against the ecosystem's own DSpark code:
# speculators==0.9.0 (loads/writes our speculators layout) and specforge==0.2.0 (its DSpark
# objective is the loss oracle). docs/interop.md says what is compared and which conventions differ.
#
# Why a separate venv: speculators pins transformers<=5.19 and specforge pins torch 2.11 and sglang;
# neither belongs in the main env. Both are installed with --no-deps, plus exactly the modules their
# imports reach (found by trying: `import speculators.models.dspark`,
# `import specforge.algorithms.common.dflash_family_model`). `.venv-interop/` is reused while its
# stamp matches.
#
# Usage: scripts/test_interop.sh [extra pytest args]   (INTEROP_VENV=/path for another venv)
#        scripts/test_interop.sh --build-only          (build the venv if stale, run no test)
# Exit code: pytest's; "no tests collected" (5) also fails. With --build-only: 0 once the venv is
# ready, non-zero if building it failed.
set -euo pipefail
BUILD_ONLY=0
if [[ "${1:-}" == "--build-only" ]]; then
    BUILD_ONLY=1
    shift
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${INTEROP_VENV:-$REPO/.venv-interop}"
TORCH_VERSION="2.13.0"
PINNED=("speculators==0.9.0" "specforge==0.2.0")
# What their imports need (speculators: transformers <= 5.19, pydantic, openai, datasets,
# hs-connectors, loguru; specforge's DSpark objective: torch only), what our code needs that those
# do not bring (safetensors, tokenizers and jinja2 come with transformers), and pytest.
DEPS=("transformers>=5.16,<=5.19" "pydantic>=2" "openai>=2" "datasets>=4,<=5.1.0"
      "hs-connectors==0.9.0" "loguru>=0.7.2,<=0.7.3" "safetensors>=0.5" "pytest>=8")
STAMP="recipe=1 repo=$REPO torch=$TORCH_VERSION pinned=${PINNED[*]} deps=${DEPS[*]}"

t0=$SECONDS
pip_install() {
    # Dropped noise: the machine's pip config lists local index folders that lack most names, and
    # pip's resolver lists the requirements of the two --no-deps packages that are not installed
    # on purpose (sglang, torch 2.11, ...).
    "$VENV/bin/python" -m pip install --quiet --progress-bar off "$@" \
        2> >(grep -v -E "is ignored: it is neither a file nor a directory|^(specforge|speculators) [0-9.]+ requires |^ERROR: pip's dependency resolver does not currently" >&2)
}

if [[ -x "$VENV/bin/python" && -f "$VENV/.dspark-stamp" && "$(cat "$VENV/.dspark-stamp")" == "$STAMP" ]]; then
    echo "[test_interop] reusing $VENV"
else
    echo "[test_interop] building $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    # torch first, pinned: the CPU wheel on disk. An unpinned torch would pull a CUDA build.
    pip_install "torch==$TORCH_VERSION"
    pip_install --no-deps "${PINNED[@]}"
    pip_install "torch==$TORCH_VERSION" "${DEPS[@]}"
    pip_install --no-deps -e "$REPO"
    "$VENV/bin/python" -c "import speculators.models.dspark, specforge.algorithms.common.dflash_family_model, common, serve.engine" \
        2> >(grep -v -i "warn" >&2)
    echo "$STAMP" > "$VENV/.dspark-stamp"
fi
echo "[test_interop] venv ready after $((SECONDS - t0)) s"
[[ $BUILD_ONLY -eq 1 ]] && exit 0

cd "$REPO"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
t1=$SECONDS
set +e
# -o addopts="": the repo default marker filter does not apply here; -ra gives xfail reasons.
"$VENV/bin/python" -m pytest tests/interop -p no:cacheprovider -o addopts="" -v -ra "$@"
rc=$?
set -e
echo "[test_interop] suite took $((SECONDS - t1)) s; total $((SECONDS - t0)) s; pytest exit $rc"
if [[ $rc -eq 5 ]]; then
    echo "[test_interop] FAIL: no tests collected" >&2
fi
exit $rc
