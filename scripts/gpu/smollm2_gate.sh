#!/usr/bin/env bash
# SmolLM2, stage 7 (~3 min): the vLLM-vs-engine gate (scripts/gpu/vllm_vs_engine.py, criteria in its
# docstring) on 128 held-out prompts (ShareGPT and HumanEval interleaved), float32.
set -uo pipefail; cd "$(dirname "$0")/../.."; D=artifacts/smollm2-data
TARGET=artifacts/smollm2-135m-instruct DRAFT=outputs/smollm2_dspark/final \
  bash scripts/gpu/vllm_gate.sh --num-prompts 128 --max-tokens 192 \
  --prompts sharegpt=$D/sharegpt-heldout.jsonl humaneval=$D/humaneval-heldout.jsonl
