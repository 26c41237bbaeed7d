#!/usr/bin/env bash
# One device call on an H200: the speed rows that need no trained model.
#   1. the Markov loop at Qwen3-8B draft sizes (vocab 151,936, rank 256, block 7), dense vs top-k,
#      batch 1/8/64, eager vs CUDA-graph captured (scripts/bench_markov.py);
#   2. the loss's peak memory, chunked vs unchunked, at vocab 151,936 (scripts/bench_train.py).
# Run from the repo root: `bash scripts/gpu/bench_speed.sh`; results land in $OUT (or ./gpu-out).
set -uo pipefail
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
timeout 150 python3 scripts/bench_markov.py --device cuda --vocabs 151936 --batches 1 8 64 \
  --block 7 --rank 256 --hidden 4096 --topk 64 --iters 20 --cuda-graph 2>&1 | tee "$OUT/markov_h200.txt"
timeout 120 python3 scripts/bench_train.py --json "$OUT/loss_h200.json" loss --device cuda \
  --hidden 4096 --anchors 512 --seq 4096 --chunk 1024 --iters 3 2>&1 | tee "$OUT/loss_h200.txt"
timeout 150 python3 scripts/bench_draft_step.py --device cuda --hidden 4096 --layers 5 \
  --vocab 151936 --rank 256 --ctx 1024 --batches 1 8 64 2>&1 | tee "$OUT/draft_step_h200.txt"
