#!/usr/bin/env bash
# The README's test command. Installs what the tests need, then runs: ruff, the CPU test suite,
# and the vLLM-compatibility suite in its own virtual environment (scripts/test_vllm.sh), so the
# main environment never holds vLLM. Fails on the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
# The two venvs below take about 6 GB; a full disk shows up late, as a pip OSError.
echo "[test] $(df -h --output=avail . | tail -1 | tr -d ' ') free on this disk (the venvs need about 6 GB)"
# torch first, pinned: the CPU wheel on disk. An unpinned resolve would pull a multi-GB CUDA build.
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[dev]"
python3 -m ruff check .
python3 -m ruff format --check .
# vLLM 0.34 source files and Triton's CPU interpreter for the oracle tests (ignored folder).
bash scripts/fetch_vllm_oracle.sh || echo "[test] vLLM oracle files unavailable: the oracle tests skip"
python3 -m pytest -m "not vllm" -p no:cacheprovider -o addopts="" -q
bash scripts/test_vllm.sh
bash scripts/test_interop.sh
