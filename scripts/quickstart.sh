#!/usr/bin/env bash
# The README's main job on the embedded default: install, build the tiny target (a small Qwen3 +
# BPE tokenizer trained here on the Python standard library, ~3 min), distill a DSpark draft
# against it, export outputs/tiny/final in vLLM's format, and print the held-out metrics.
# About 6-9 minutes on 2 CPU cores. Then: python -m serve.launch (serves it; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export WANDB_MODE="${WANDB_MODE:-disabled}"
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e .
python3 -m train.distill +experiment=tiny overwrite=true "$@"
python3 -m serve.check outputs/tiny/final
