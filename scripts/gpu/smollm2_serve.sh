#!/usr/bin/env bash
# SmolLM2, stage 6 (~5 min): real vLLM through `python -m serve.launch engine=vllm`, CUDA graphs on,
# target-only vs the DSpark draft, T=0, `serve.bench` at concurrency 1, 8 and 32 on held-out ShareGPT
# prompts (<= 768 tokens, chat template applied here; 256 new tokens). serve.bench times the first
# token (prefill) apart from the rest (TPOT): decode speed-up = TPOT target-only / TPOT DSpark.
set -uo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh; wait_for_vllm || exit 1
unset VLLM_ENABLE_V1_MULTIPROCESSING  # the API server runs its engine core in a process of its own
T=artifacts/smollm2-135m-instruct; D=artifacts/smollm2-data; P=$D/bench_prompts.jsonl
python3 - "$T" "$D/sharegpt-heldout.jsonl" "$P" <<'PY'
import json, sys
from transformers import AutoTokenizer
from scripts.eval_acceptance import prompt_messages
target, src, dst = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(target)
kept = 0
with open(dst, "w") as out:
    for line in open(src):
        text = tok.apply_chat_template(prompt_messages(json.loads(line)), add_generation_prompt=True, tokenize=False)
        if len(tok(text, add_special_tokens=False)["input_ids"]) <= 768:
            out.write(json.dumps({"prompt": text}) + "\n"); kept += 1
print(f"{kept} bench prompts")
PY
serve_and_bench() {  # NAME CHECKPOINT PORT
  python3 -m serve.launch engine=vllm target=$T checkpoint=$2 port=$3 max_model_len=2048 \
    draft_sampling=greedy seed=0 >"$OUT/serve_$1.log" 2>&1 &
  local pid=$! ok=0
  for _ in $(seq 150); do
    python3 -c "import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)" \
      "http://127.0.0.1:$3/health" 2>/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break; sleep 2
  done
  if [ $ok = 1 ]; then
    python3 -m serve.bench --base-url "http://127.0.0.1:$3" --concurrency 4 --num-prompts 8 \
      --max-tokens 32 --prompts $P >/dev/null  # warm-up, not recorded
    for c in 1 8 32; do
      python3 -m serve.bench --base-url "http://127.0.0.1:$3" --concurrency $c \
        --num-prompts $((c < 4 ? 16 : 4 * c)) --max-tokens 256 --temperature 0 --prompts $P \
        --json "$OUT/vllm_$1_c$c.json" | tail -22
    done
  else
    echo "server $1 did not come up"; tail -30 "$OUT/serve_$1.log"
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null; sleep 3
}
serve_and_bench target_only null 8011
serve_and_bench dspark outputs/smollm2_dspark/final 8012
python3 scripts/vllm_speedup_table.py "$OUT" | tee "$OUT/vllm_speedup.txt"
