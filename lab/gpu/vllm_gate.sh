#!/usr/bin/env bash
# The serve-time acceptance gate in one script: train (if $DRAFT is absent), export and
# check the checkpoint, serve it through real vLLM and compare with our engine
# (lab/gpu/vllm_vs_engine.py; exit 1 if a check fails). Needs vLLM in $VLLM_SITE (default
# /tmp/vsite, 0.26 from vllm_install.sh; /tmp/v34site for 0.34; waited for up to 15 min). Writes
# $OUT/$GATE_NAME.{json,txt} (default vllm_gate). Pair: the small one of small.stages by default, or
#   TARGET=artifacts/tiny-target DRAFT=outputs/tiny/final EXPERIMENT=tiny bash lab/gpu/vllm_gate.sh
set -euo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
TARGET="${TARGET:-artifacts/small-target}"; DRAFT="${DRAFT:-outputs/small_gpu/final}"
if [ ! -f "$DRAFT/model.safetensors" ]; then  # train + export (the final/ folder is the export)
  python3 -m train.distill "$LAB_SEARCHPATH" +experiment="${EXPERIMENT:-small_gpu}" overwrite=true \
    trainer.progress=false 2>&1 | tail -5
fi
python3 -m serve.check "$DRAFT" --vllm
VLLM_SITE="${VLLM_SITE:-/tmp/vsite}"; GATE_NAME="${GATE_NAME:-vllm_gate}"
for _ in $(seq 180); do [ -f "$VLLM_SITE/.ready" ] && break; sleep 5; done
export PYTHONPATH="$VLLM_SITE:$PYTHONPATH"
python3 lab/gpu/vllm_vs_engine.py --target "$TARGET" --draft "$DRAFT" \
  --json "$OUT/$GATE_NAME.json" "$@" 2>&1 | grep -v "it/s]" | tee "$OUT/$GATE_NAME.txt"
