#!/usr/bin/env bash
# SmolLM2, stage 7 (~3 min a gate): the vLLM-vs-engine gate (lab/gpu/vllm_vs_engine.py, criteria in
# its docstring) on held-out prompts (ShareGPT and HumanEval interleaved), float32.
#   bash lab/gpu/smollm2_gate.sh [0.26|0.34] [NUM_PROMPTS [plain|adaptive|both [DRAFT]]]
# 0.26 (default): vllm_gate.json, every draft verified. 0.34 (the serving pin, vllm034_install.sh):
# `plain` vllm034_gate.json the same way (NUM_PROMPTS, default 128, x 192 tokens); `adaptive`
# vllm034_gate_adaptive.json with adaptive verification on in both stacks and the schedulers
# matched (--matched-schedule: one request at a time, vLLM's own cost tables and budget lag in the
# engine; CUDA graphs, which vLLM needs for it) on 96 prompts x 128 tokens (about 5.8k drafts per
# temperature: MDD at position 0 about 0.04); `both` (default) one then the other.
# DRAFT: default outputs/smollm2_dspark/final; DRAFT,FALLBACK...: the first that holds a
# checkpoint (vllm_gate.sh would train a small draft in place of a missing one).
set -uo pipefail; cd "$(dirname "$0")/../.."; D=artifacts/smollm2-data; source lab/gpu/env.sh
DRAFT=$(first_draft "${4:-outputs/smollm2_dspark/final}") || exit 2
export TARGET=artifacts/smollm2-135m-instruct DRAFT
PROMPTS=(--prompts sharegpt=$D/sharegpt-heldout.jsonl humaneval=$D/humaneval-heldout.jsonl)
ARGS=(--num-prompts "${2:-128}" --max-tokens 192 "${PROMPTS[@]}")
WHICH="${3:-both}"
case "$WHICH" in plain|adaptive|both) ;; *) echo "third argument: plain, adaptive or both" >&2; exit 2 ;; esac
case "${1:-0.26}" in
  0.26) bash lab/gpu/vllm_gate.sh "${ARGS[@]}" ;;
  0.34)
    source lab/gpu/vllm034_install.sh; wait_for_vllm034 || exit 1
    export VLLM_SITE=/tmp/v34site; rc=0
    if [ "$WHICH" != adaptive ]; then
      GATE_NAME=vllm034_gate bash lab/gpu/vllm_gate.sh "${ARGS[@]}" || rc=1
    fi
    if [ "$WHICH" != plain ]; then
      GATE_NAME=vllm034_gate_adaptive bash lab/gpu/vllm_gate.sh --num-prompts 96 \
        --max-tokens 128 "${PROMPTS[@]}" --adaptive --cuda-graphs --matched-schedule || rc=1
    fi
    exit $rc ;;
  *) echo "usage: smollm2_gate.sh [0.26|0.34] [NUM_PROMPTS [plain|adaptive|both [DRAFT]]]" >&2; exit 2 ;;
esac
