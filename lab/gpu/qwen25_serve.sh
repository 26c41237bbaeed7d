#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B-Instruct with the recipe's draft in vLLM 0.34, through the product's launcher
# (`python -m serve.launch engine=vllm`, CUDA graphs sized by it to max_num_seqs x (N + 1)), on the
# recipe's test prompts (chat template applied here exactly as serve.evaluate applies it; prompts
# over 768 tokens skipped as it skips them; 256 new tokens). One server a row, in this order (a
# machine lost midway still returns the first rows):
#   dspark           acceptance from vLLM's counters on each whole test set (code T=0, chat T=0,
#                    code T=1; c=32), on the first EVAL_PROMPTS of each at T=0 (the prompts
#                    serve.evaluate decodes in the engine), then decode speed (TPOT) on code and chat
#                    prompts alternated at concurrency 1 / 8 / 32 / 128, T=0
#   target_only      the same speed runs
#   dspark_adaptive  the same speed runs with adaptive verification (the confidence head calibrated
#                    first: train.publish.calibrate --fold-into-weights on the dev answers), then
#                    its acceptance on the code test set at T=0
# scripts/vllm_speedup_table.py pairs the speed runs' requests for the decode speed-ups' intervals.
#   bash lab/gpu/qwen25_serve.sh [ROW...]        (default: dspark target_only dspark_adaptive)
# Reproduces: docs/results/qwen25_coder_1p5b (serving rows).
set -uo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
source lab/gpu/vllm034_install.sh; wait_for_vllm034 || exit 1
unset VLLM_ENABLE_V1_MULTIPROCESSING  # the API server runs its engine core in a process of its own
R="${RECIPE_OUT:-artifacts/recipes/qwen2.5-coder-1.5b-instruct}" EVAL_PROMPTS="${EVAL_PROMPTS:-64}"
T=$R/target/model DRAFT=$R/distill/run/final P=$R/bench S="$OUT/serve"
ROWS=("$@"); [ $# -gt 0 ] || ROWS=(dspark target_only dspark_adaptive)
LEVELS=(1 8 32 128)
mkdir -p "$P" "$S"
[ -f "$DRAFT/config.json" ] || { echo "no draft at $DRAFT" >&2; exit 2; }
python3 - "$T" "$R/prompts" "$P" "$EVAL_PROMPTS" <<'PY'
import json, sys
from transformers import AutoTokenizer
target, src, dst, first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(target)
def rendered(path):
    out = []
    for line in open(path):
        turns = []
        for m in json.loads(line)["messages"]:
            if m["role"] == "assistant":
                break
            turns.append({"role": m["role"], "content": m["content"]})
        text = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        if len(tok(text, add_special_tokens=False)["input_ids"]) <= 768:
            out.append(text)
    return out
sets = {d: rendered(f"{src}/test.{d}.jsonl") for d in ("code", "chat")}
def write(name, texts):
    with open(f"{dst}/{name}.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": t}) + "\n" for t in texts)
for d, texts in sets.items():
    write(d, texts)
    write(f"{d}_first", texts[:first])
mixed = [t for pair in zip(sets["code"], sets["chat"]) for t in pair]
write("mixed", mixed)
print({k: len(v) for k, v in sets.items()}, "mixed", len(mixed))
PY
bench() {  # PORT NAME PROMPTS CONCURRENCY NUM TEMPERATURE
  python3 -m serve.bench --base-url "http://127.0.0.1:$1" --concurrency "$4" --num-prompts "$5" \
    --max-tokens 256 --temperature "$6" --prompts "$P/$3.jsonl" --json "$S/$2.json" | tail -8
}
lines() { wc -l <"$P/$1.jsonl"; }
serve_row() {  # ROW PORT [serve.launch overrides...]
  local row=$1 port=$2 ckpt=$DRAFT; shift 2
  [ "$row" = target_only ] && ckpt=null
  python3 -m serve.launch engine=vllm target=$T checkpoint=$ckpt port=$port max_model_len=2048 \
    max_num_seqs=128 draft_sampling=greedy seed=0 "$@" >"$S/serve_$row.log" 2>&1 &
  local pid=$!
  if wait_healthy $port $pid 200; then
    echo "$(date +%T) $row up"
    python3 -m serve.bench --base-url "http://127.0.0.1:$port" --concurrency 8 --num-prompts 16 \
      --max-tokens 32 --prompts "$P/mixed.jsonl" >/dev/null  # warm-up, not recorded
    if [ "$row" = dspark ]; then
      bench $port tau_dspark_code_t0 code 32 "$(lines code)" 0
      bench $port tau_dspark_chat_t0 chat 32 "$(lines chat)" 0
      bench $port tau_dspark_code_t1 code 32 "$(lines code)" 1
      bench $port tau_dspark_code_first_t0 code_first 32 "$(lines code_first)" 0
      bench $port tau_dspark_chat_first_t0 chat_first 32 "$(lines chat_first)" 0
    fi
    for c in "${LEVELS[@]}"; do
      bench $port "vllm_${row}_c$c" mixed $c $((c == 1 ? 24 : c == 8 ? 64 : 2 * c)) 0
    done
    [ "$row" = dspark_adaptive ] && bench $port tau_dspark_adaptive_code_t0 code 32 "$(lines code)" 0
  else
    echo "server $row did not come up"; tail -30 "$S/serve_$row.log"
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null; sleep 3
}
port=8021
for row in "${ROWS[@]}"; do
  case "$row" in
    dspark|target_only) serve_row $row $port ;;
    dspark_adaptive)
      # the confidence head calibrated on the dev answers, one temperature folded into its weights
      # (vLLM 0.34 reads no temperature), on a copy: the plain rows serve the draft as trained
      CAL=$R/distill/run/final-calibrated; rm -rf "$CAL"; cp -r "$DRAFT" "$CAL"
      python3 -m train.publish.calibrate "$CAL" --target "$T" --data "$R/regenerate/dev.jsonl" \
        --fold-into-weights >"$S/calibrate.log" 2>&1 && tail -14 "$S/calibrate.log" ||
        { echo "calibration failed: the head as trained"; tail -5 "$S/calibrate.log"; cp -r "$DRAFT"/. "$CAL"/; }
      DRAFT=$CAL serve_row $row $port adaptive_verification=true ;;
    *) echo "qwen25_serve.sh: unknown row $row" >&2; exit 2 ;;
  esac
  port=$((port + 1))
  python3 scripts/vllm_speedup_table.py "$S" --json "$S/speedup.json" | tee "$S/speedup.txt"
done
