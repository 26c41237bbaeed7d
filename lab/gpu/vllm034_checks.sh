#!/usr/bin/env bash
# vLLM 0.34 on a GPU host without network, after vllm034_install.sh (the last carry call runs it):
#   bash lab/gpu/vllm034_checks.sh suite    # tests/vllm against vLLM 0.34, then serve.parity with
#                                           # vLLM as the reference on the tiny pair carried in .tinyrun
#   bash lab/gpu/vllm034_checks.sh round    # the round cost at Qwen2.5-Coder-1.5B's shape (dummy
#                                           # weights): t_step, t_round (3-layer draft, 32k vocabulary,
#                                           # 7 drafts, CUDA graphs sized to the widest verify) at batch
#                                           # 1/8/32/128 and the eager profile's split at batch 8 and 32
#   bash lab/gpu/vllm034_checks.sh dispatch # the round-gap check (lab/analysis/vllm034_round_suspects.md,
#                                           # G1): target step and DSpark round at batch 1/8/32/128 with
#                                           # every decode step's CUDA-graph dispatch counted, CUDA graphs
#                                           # sized by token counts (as 0.26 takes them) and then by
#                                           # request counts (0.34's own keys)
# Reproduces: the qwen25_coder_1p5b rows of docs/results (round cost, parity on a GPU). Delete when
# the 1.5B recipe's serving run measures these on the real target.
set -uo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
source lab/gpu/vllm034_install.sh; wait_for_vllm034 || exit 1
case "${1:-}" in
suite)
  timeout 200 python3 -m pytest tests/vllm -m vllm -o addopts="" -p no:cacheprovider -q -rfEs \
    --junitxml "$OUT/vllm034_tests.xml" 2>&1 | tail -40 | tee "$OUT/vllm034_tests.txt"
  t=.tinyrun
  if [ -d "$t/final" ]; then
    head -n 64 "$t/tiny-target/data/heldout.jsonl" >/tmp/parity_prompts.jsonl
    timeout 240 python3 -m serve.parity "$t/final" --target "$t/tiny-target" \
      --prompts /tmp/parity_prompts.jsonl --reference vllm --max-prompts 64 --max-new-tokens 48 \
      --device cuda --json "$OUT/parity_vllm034_tiny.json" 2>&1 | tail -40 | tee "$OUT/parity.txt"
  fi
  ;;
round)
  timeout 560 python3 lab/gpu/vllm_round_cost.py --shape qwen25_coder_1p5b --out "$OUT/round" \
    --configs target dspark_v32k_k7 profile --ks 7 --vocabs v32k --batches 1 8 32 128 \
    --profile-batches 8 32 --budget-s 420 --child-timeout 170 2>&1 | tail -60
  ;;
dispatch)
  for capture in tokens requests; do
    configs="target dspark_v32k_k7" budget=230
    [ $capture = requests ] && configs="dspark_v32k_k7 target" budget=200
    # shellcheck disable=SC2086
    timeout 400 python3 lab/gpu/vllm_round_cost.py --shape qwen25_coder_1p5b \
      --out "$OUT/round_$capture" --configs $configs --ks 7 --vocabs v32k --batches 1 8 32 128 \
      --capture $capture --dispatch-log --child-timeout 170 --budget-s $budget 2>&1 | tail -40
  done
  ;;
*) echo "usage: bash lab/gpu/vllm034_checks.sh suite|round|dispatch" >&2; exit 2 ;;
esac
