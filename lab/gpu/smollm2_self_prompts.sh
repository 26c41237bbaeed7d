#!/usr/bin/env bash
# SmolLM2: prompts the target writes itself (train.prepare.self_prompts) with vLLM on the GPU, for the
# "many more distinct rows" lever (779680f:docs/benchmarks.md, "Prompts the target writes itself"): how
# fast, and how many of N sampled survive its checks at scale (repeats grow with the count).
#   bash lab/gpu/smollm2_self_prompts.sh [COUNT]     (default 16000)
# Writes artifacts/smollm2-data/self-train.jsonl (smollm2_regenerate.sh --extra self answers it)
# and copies it, its report and the timing to $OUT. SELF_BACKEND=hf rehearses it on a CPU.
set -euo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
COUNT="${1:-16000}" BACKEND="${SELF_BACKEND:-vllm}" D=artifacts/smollm2-data
wait_for_files 300 artifacts/smollm2-135m-instruct/prepare_summary.json
GRAPHS="" BATCH=8
if [ "$BACKEND" = vllm ]; then wait_for_vllm; GRAPHS=--vllm-cuda-graphs BATCH=4096; fi
mkdir -p $D; t0=$SECONDS
rc=0  # a short run (exit 1) still copies what it wrote and its report
python3 -m train.prepare.self_prompts --target artifacts/smollm2-135m-instruct --out $D/self-train.jsonl \
  --count "$COUNT" --batch-size $BATCH --backend "$BACKEND" $GRAPHS 2>&1 | grep --line-buffered -v "it/s\]" || rc=$?
echo "{\"count\": $COUNT, \"backend\": \"$BACKEND\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" | tee "$OUT/self_prompts_time.json"
cp $D/self-train.jsonl* "$OUT/" 2>/dev/null || true
exit $rc
