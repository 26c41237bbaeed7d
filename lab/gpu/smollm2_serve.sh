#!/usr/bin/env bash
# SmolLM2, stage 6 (~5 min): real vLLM through `python -m serve.launch engine=vllm`, CUDA graphs on,
# target-only vs the DSpark draft, T=0, `serve.bench` at concurrency 1, 8 and 32 on held-out ShareGPT
# prompts (<= 768 tokens, chat template applied here; 256 new tokens). serve.bench times the first
# token (prefill) apart from the rest (TPOT): decode speed-up = TPOT target-only / TPOT DSpark.
# 32 / 64 / 256 requests at concurrency 1 / 8 / 32 (16 / 32 / 128 until 2026-12-05, when drafts of
# about the same acceptance read 0.79x and 1.44x at 8 in runs of 2 s); vllm_speedup_table.py pairs
# the rows' requests by index for a 95% interval on each speed-up.
#   bash lab/gpu/smollm2_serve.sh [0.26|0.34] [DRAFT_DIR[,FALLBACK_DIR...]] [plain | ROW...] [concurrency=C,C...]
# 0.26 (default): vLLM 0.26 from /tmp/vsite (vllm_install.sh). 0.34: the serving pin from /tmp/v34site
# (vllm034_install.sh), one more row unless `plain`: the draft with adaptive verification (confidence
# head). DRAFT_DIR: default outputs/smollm2_dspark/final; with FALLBACK_DIRs, the first of them
# that holds a checkpoint when DRAFT_DIR does not (a draft trained earlier in the session may have
# failed; serving the one before it still measures the speed-up). ROWs, one server each, in this order
# (default: dspark target_only, and dspark_adaptive with 0.34): dspark, target_only,
# dspark_adaptive, dspark_kN (the draft proposing N of its tokens a round: at low acceptance the
# last slots add little and cost verify work at high concurrency). Every row lands in $OUT as
# vllm_ROW_cC.json and the speed-up table covers all rows there, earlier stages' too.
# concurrency=1 (default 1,8,32): only those levels, for a session short of minutes.
set -uo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
VLLM_SERIES="${1:-0.26}" DRAFTS="${2:-outputs/smollm2_dspark/final}" ROWS=() LEVELS=(1 8 32)
for a in "${@:3}"; do
  case "$a" in
    concurrency=*) IFS=, read -r -a LEVELS <<<"${a#concurrency=}"
      for c in "${LEVELS[@]}"; do [[ "$c" =~ ^[1-9][0-9]*$ ]] || { echo "smollm2_serve.sh: bad $a" >&2; exit 2; }; done ;;
    plain) ROWS=(dspark target_only) ;;
    dspark|target_only|dspark_adaptive|dspark_k[1-9]) ROWS+=("$a") ;;
    *) echo "smollm2_serve.sh: unknown row $a (dspark, target_only, dspark_adaptive, dspark_kN, plain)" >&2; exit 2 ;;
  esac
done
if [ ${#ROWS[@]} = 0 ]; then
  ROWS=(dspark target_only); [ "$VLLM_SERIES" = 0.34 ] && ROWS+=(dspark_adaptive)
fi
DRAFT=$(first_draft "$DRAFTS") || exit 2
case "$VLLM_SERIES" in
  0.26) wait_for_vllm || exit 1 ;;
  0.34) source lab/gpu/vllm034_install.sh; wait_for_vllm034 || exit 1 ;;
  *) echo "usage: smollm2_serve.sh [0.26|0.34]" >&2; exit 2 ;;
esac
unset VLLM_ENABLE_V1_MULTIPROCESSING  # the API server runs its engine core in a process of its own
T=artifacts/smollm2-135m-instruct; D=artifacts/smollm2-data; P=$D/bench_prompts.jsonl
python3 - "$T" "$D/sharegpt-heldout.jsonl" "$P" <<'PY'
import json, sys
from transformers import AutoTokenizer
from train.data.regenerate import regeneration_prompt
target, src, dst = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(target)
kept = 0
with open(dst, "w") as out:
    for line in open(src):
        text = tok.apply_chat_template(regeneration_prompt(json.loads(line)), add_generation_prompt=True, tokenize=False)
        if len(tok(text, add_special_tokens=False)["input_ids"]) <= 768:
            out.write(json.dumps({"prompt": text}) + "\n"); kept += 1
print(f"{kept} bench prompts")
PY
serve_and_bench() {  # NAME CHECKPOINT PORT [serve.launch overrides...]
  local name=$1 ckpt=$2 port=$3; shift 3
  python3 -m serve.launch engine=vllm target=$T checkpoint=$ckpt port=$port max_model_len=2048 \
    draft_sampling=greedy seed=0 "$@" >"$OUT/serve_$name.log" 2>&1 &
  local pid=$!
  if wait_healthy $port $pid; then
    python3 -m serve.bench --base-url "http://127.0.0.1:$port" --concurrency 4 --num-prompts 8 \
      --max-tokens 32 --prompts $P >/dev/null  # warm-up, not recorded
    for c in "${LEVELS[@]}"; do
      python3 -m serve.bench --base-url "http://127.0.0.1:$port" --concurrency $c \
        --num-prompts $((c < 4 ? 32 : 8 * c)) --max-tokens 256 --temperature 0 --prompts $P \
        --json "$OUT/vllm_${name}_c$c.json" | tail -22
    done
  else
    echo "server $name did not come up"; tail -30 "$OUT/serve_$name.log"
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null; sleep 3
}
# The draft first by default: a machine lost in the middle still returns its rows.
port=8011
for row in "${ROWS[@]}"; do
  case "$row" in
    dspark) serve_and_bench dspark "$DRAFT" $port ;;
    target_only) serve_and_bench target_only null $port ;;
    dspark_adaptive) serve_and_bench dspark_adaptive "$DRAFT" $port adaptive_verification=true ;;
    dspark_k*) serve_and_bench "$row" "$DRAFT" $port num_speculative_tokens=${row#dspark_k} ;;
  esac
  port=$((port + 1))
done
python3 scripts/vllm_speedup_table.py "$OUT" | tee "$OUT/vllm_speedup.txt"
