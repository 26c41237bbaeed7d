#!/usr/bin/env bash
# SmolLM2, stage 1 (~1 min): the bf16 target from the GGUF (packed by carry_pieces.py across calls;
# session.sh puts it in /tmp/carry once whole and its sha256 checked), and the prepared
# ShareGPT/HumanEval rows (.data).
set -euo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
C=$CARRY_DIR; G=$C/SmolLM2-135M-Instruct.Q4_1.gguf; D=artifacts/smollm2-data
# The GGUF and the prepared rows may come in later calls than the one that started this.
wait_for_files 300 "$G" $C/sharegpt-train.jsonl.gz $C/sharegpt-heldout.jsonl.gz \
  $C/humaneval-heldout.jsonl.gz
python3 -m train.prepare.target smollm2-135m-instruct --gguf "$G" --out artifacts/smollm2-135m-instruct
cp artifacts/smollm2-135m-instruct/prepare_summary.json "$OUT/"
mkdir -p $D; for f in $C/*.jsonl.gz; do gunzip -c "$f" >"$D/$(basename "${f%.gz}")"; done
wc -l $D/*.jsonl
