#!/usr/bin/env bash
# SmolLM2, stage 1 (~1 min): the bf16 target from the GGUF carried in two parts (.gg1/.gg2, copied to
# /tmp/carry by the calls that carried them), and the prepared ShareGPT/HumanEval rows (.data).
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
C=/tmp/carry; G=$C/SmolLM2-135M-Instruct.Q4_1.gguf; D=artifacts/smollm2-data
# The GGUF's parts and the prepared rows may come in later calls than the one that started this.
wait_for_files 300 $C/gguf.00 $C/gguf.01 $C/SHA256SUMS $C/sharegpt-train.jsonl.gz \
  $C/sharegpt-heldout.jsonl.gz $C/humaneval-heldout.jsonl.gz
cat $C/gguf.0* >"$G"; (cd $C && sha256sum -c SHA256SUMS)
python3 -m train.prepare_target smollm2-135m-instruct --gguf "$G" --out artifacts/smollm2-135m-instruct
cp artifacts/smollm2-135m-instruct/prepare_summary.json "$OUT/"
mkdir -p $D; for f in $C/*.jsonl.gz; do gunzip -c "$f" >"$D/$(basename "${f%.gz}")"; done
wc -l $D/*.jsonl
