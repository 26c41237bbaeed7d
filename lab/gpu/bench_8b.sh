#!/usr/bin/env bash
# Qwen3-8B scale on one H200 with random/dummy weights (no download), stages in order, each under
# its own time limit; logs, raw JSON and summary.json in $OUT (stages.txt: times and exit codes):
#   train_qwen3_8b  scripts/bench_train.py step8b: the trainer step, Qwen3-8B target, speed variants
#   train_smollm2   the same at the SmolLM2-135M shape
#   vllm_a / vllm_b lab/gpu/vllm_round_cost.py: target step vs DSpark round (32k and full
#                   vocab, K=7) at batch 1/8/32/128, and the eager profile of a round
#   vllm_k          the same for K = 5, 3, 1
#   adaptive        lab/gpu/adaptive_emulation.py on the measured costs (CPU)
# SKIP_STAGES="NAME ..." leaves those stages out (a session with less device time: the 8B rows'
# goals are met, the K sweep has none; the adaptive stage is CPU math that can run anywhere).
# vLLM 0.26 must be in /tmp/vsite (lab/gpu/vllm_install.sh; env.sh's wait_for_vllm waits for it).
# Run from the repo root: `bash lab/gpu/bench_8b.sh [all|train|vllm]` (or detached, as run_all.sh
# is): `train` runs the two training stages alone (no vLLM needed), `vllm` the rest.
set -uo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
PART="${1:-all}"
case "$PART" in all|train|vllm) ;; *) echo "usage: bench_8b.sh [all|train|vllm]" >&2; exit 2 ;; esac
skipped() { case " ${SKIP_STAGES:-} " in *" $1 "*) return 0 ;; esac; return 1; }
stage() {  # stage NAME SECONDS CMD...: run in its own process group, killed whole at the limit
  local name=$1 limit=$2; shift 2
  skipped "$name" && { echo "$(date +%T) skip $name" >>"$OUT/stages.txt"; return; }
  echo "$(date +%T) start $name" >>"$OUT/stages.txt"
  setsid "$@" >"$OUT/$name.log" 2>&1 & local pid=$!
  ( sleep "$limit"; kill -TERM -- -"$pid" 2>/dev/null; sleep 10; kill -KILL -- -"$pid" 2>/dev/null ) &
  local watcher=$!
  wait "$pid"; local rc=$?
  kill "$watcher" 2>/dev/null
  echo "$(date +%T) end $name rc=$rc" >>"$OUT/stages.txt"
  grep -v "it/s\]" "$OUT/$name.log" | tail -25
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/device.txt"
if [ "$PART" != vllm ]; then
# Only rows not yet measured run (779680f:docs/benchmarks.md): at 8B the compiled target with the teacher
# once per row (loss.share_teacher=false) and the compiled loss; at the SmolLM2 shape the fastest
# row of 2026-12-05 (since then the draft's rotary angles are computed once per forward) at 64
# and at 128 rows a step, in one run.
T8=fused_flex_tflex_compile_tcompile MB="+loss.chunk_tokens=8192+trainer.micro_batch_size=64"
stage train_qwen3_8b 300 python3 scripts/bench_train.py --json "$OUT/train_qwen3_8b.json" \
  step8b --shape qwen3_8b --keep-going --no-matmul \
  --variants "$T8" "$T8+loss.share_teacher=false" "${T8}_lcompile"
stage train_smollm2 240 python3 scripts/bench_train.py --json "$OUT/train_smollm2.json" \
  step8b --shape smollm2_135m --steps 5 --keep-going --profile-dir "$OUT/train_smollm2_profile" \
  --variants "${T8}_lcompile$MB" "${T8}_lcompile+loss.chunk_tokens=16384+trainer.micro_batch_size=128"
fi
if [ "$PART" != train ]; then
if ! { skipped vllm_a && skipped vllm_b && skipped vllm_k; }; then
  wait_for_vllm || true  # its stages then fail fast and say so in their logs
fi
VR=(python3 lab/gpu/vllm_round_cost.py --out "$OUT/vllm_round" --child-timeout 200)
# Each call skips what an earlier one finished, so a configuration cut by one limit runs next.
stage vllm_a 240 "${VR[@]}" --budget-s 225 --configs target dspark_v32k_k7
stage vllm_b 220 "${VR[@]}" --budget-s 200 --configs target dspark_v32k_k7 dspark_vfull_k7 profile
stage vllm_k 220 "${VR[@]}" --budget-s 200 --configs target \
  dspark_v32k_k7 dspark_vfull_k7 profile dspark_v32k_k5 dspark_v32k_k3 dspark_v32k_k1
stage adaptive 60 python3 lab/gpu/adaptive_emulation.py --costs "$OUT/vllm_round/results.json" \
  --out "$OUT/adaptive"
fi
python3 lab/gpu/summarize_8b.py "$OUT"
cat "$OUT/stages.txt"
