#!/usr/bin/env bash
# Issue-4 benchmark: the README's default server (tiny target + outputs/tiny/final) against the
# same target served alone, each measured with `serve.bench` at concurrency 1 and 4.
# Prints serve.bench's tables; JSON lands in ${OUT:-/tmp/bench_serve}. CPU, a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/bench_serve}"; mkdir -p "$OUT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" HF_HUB_OFFLINE=1
for mode in dspark target_only; do
  ckpt=outputs/tiny/final; [ "$mode" = target_only ] && ckpt=null
  python3 -m serve.launch engine=embedded port=8011 checkpoint=$ckpt max_num_seqs=4 \
    > "$OUT/server_$mode.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  for _ in $(seq 120); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
  for c in 1 4; do
    echo "== $mode, concurrency $c"
    python3 -m serve.bench --base-url http://127.0.0.1:8011 --concurrency $c --num-prompts 16 \
      --max-tokens 64 --temperature 1.0 --json "$OUT/${mode}_c$c.json"
  done
  kill $pid; wait $pid 2>/dev/null || true
done
