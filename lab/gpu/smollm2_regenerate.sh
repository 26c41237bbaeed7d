#!/usr/bin/env bash
# SmolLM2, stage 2: the target answers the train and held-out ShareGPT prompts itself with vLLM
# (T=0.7 unless --temperature, top-p 0.8, up to 512 new tokens), one engine start for both splits.
#   bash lab/gpu/smollm2_regenerate.sh [--samples K] [--vllm 0.26|0.34] [--cuda-graphs]
#     [--max-seconds S] [--gpu-memory F] [--temperature T] [--tag NAME] [--turns later]
#     [--restore-only] [--engines N] [--start-together] [--extra NAME] [--extra-only]
# --samples K (env REGEN_SAMPLES, default 1): K answers per train prompt, each row with its own seed
#   (held-out prompts once). The 2,000-step run began to over-fit one answer per prompt.
# --vllm (default 0.26, vllm_install.sh; 0.34: vllm034_install.sh).
# --cuda-graphs (env REGEN_CUDA_GRAPHS=1): CUDA graphs and 512 running requests (eager: 9.8k
#   tokens/s on 2026-12-03). 512, not more: vLLM captures decode graphs up to 512 on Hopper by
#   default. On 2026-12-04 (vLLM 0.26, 512 running requests) it wrote 48.9 answers and 16.9k answer
#   tokens a second after a 155-s start, little above eager: the loop is bound by the host.
# --max-seconds S: done by S seconds (engine start included): no chunk of 4,096 prompts starts that
#   would end later at the previous chunk's pace (2026-12-04, when only a chunk's start was checked,
#   a 300-s budget ran to 397 s); what was written is kept and split as usual. The prompt file
#   lists the held-out prompts first, then the train prompts once per sample, so a cut run still
#   holds every held-out prompt and each train prompt's first answers.
# --gpu-memory F: vLLM's share of the GPU's memory (default 0.9), lower to share the GPU.
# --engines N (default 1): N vLLM engines share the GPU, each its own process answering every Nth
#   chunk of 1,024 prompts (train.prepare.regenerate --shard K/N, then --join-shards N), each with 0.9/N of
#   the memory (or --gpu-memory's share / N); engine K+1 starts once engine K is built (vLLM's
#   start-up memory profile asserts when another process frees GPU memory meanwhile). The loop of
#   one engine is bound by the host (above), and the machine has 16 cores. On 2026-12-05 (an H100)
#   three engines were built after 58, 106 and 150 s and wrote 13,181 answers in a 241-s stage
#   (in the machine's first vLLM stage: 84 and 150 s, the third not started, 5,120 answers).
# --start-together (with --engines N): the N engines start at once, each with a KV cache of
#   REGEN_KV_GIB GiB (default 16: 745k tokens of SmolLM2) instead of one sized by vLLM's start-up
#   memory profile, whose check is what fails while another engine frees memory; the one-by-one
#   start above left engines 1 and 2 idle for 48-150 s of a stage. On 2026-12-05 (an H100, the
#   machine's first vLLM stage, the wait for vLLM's install included) all three were built after
#   162 s and wrote 12,288 answers in a 245-s run.
# --restore-only: restore the shipped answers (below) and split them, without vLLM or new answers.
# --temperature T (default 0.7, with top-p 0.8): 0 writes the target's greedy answers, the
#   contexts a greedily served draft meets (779680f:docs/benchmarks.md, "Regeneration temperature"); use
#   --samples 1 with it (greedy answers to one prompt are all the same).
# --turns later: the prompts are each conversation's later turns (sharegpt-SPLIT.later.jsonl,
#   prepare_carry.sh: `train.prepare.data --turns later`, the chat up to its second, third, ...
#   user turn), which the first-turn sets (tags regen, greedy) leave out; use another --tag.
# --extra NAME (repeatable): NAME-train.jsonl's prompts too, spread among the train ones
#   (regen_prompts.py; pystdlib, pypackages: HumanEval-form code prompts, prepare_carry.sh);
#   --extra-only: those alone, no ShareGPT prompt (code answers under a --tag of their own).
# --tag NAME (default regen): the files are all.NAME.jsonl, train.NAME.jsonl and heldout.NAME.jsonl
#   (each with its .summary.json), so a second set of answers (e.g. --temperature 0 --tag greedy)
#   sits beside the first and smollm2_mix.sh can join them.
# A CPU rehearsal of the stage's own logic (prompts, engines, shards, join, splits), no vLLM:
#   REGEN_BACKEND=hf REGEN_MAX_ROWS=12 REGEN_MAX_NEW_TOKENS=4 REGEN_CHUNK=4 OUT=/tmp/x \
#     bash lab/gpu/smollm2_regenerate.sh --engines 3 --tag rehearsal
#   (the target in artifacts/smollm2-135m-instruct, the rows in artifacts/smollm2-data as
#   smollm2_target.sh leaves them).
# Answers an earlier session wrote (`smollm2_pack.sh data [NAME]` shipped them as
# smollm2_NAME.tgz.*; carry them into /tmp/carry before vLLM arrives) are restored first and this
# run resumes after them: with the same --samples the prompt file is the same, row for row.
set -euo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
SAMPLES="${REGEN_SAMPLES:-1}" SERIES=0.26 GRAPHS="${REGEN_CUDA_GRAPHS:-}" MAX_SECONDS="" MEMORY=""
RESTORE_ONLY="" TEMPERATURE=0.7 TAG=regen PROMPTS="" ENGINES=1 EXTRA=() TOGETHER=""
while [ $# -gt 0 ]; do
  case "$1" in
    --samples) SAMPLES=$2; shift 2 ;;
    --vllm) SERIES=$2; shift 2 ;;
    --cuda-graphs) GRAPHS=1; shift ;;
    --max-seconds) MAX_SECONDS=$2; shift 2 ;;
    --gpu-memory) MEMORY=$2; shift 2 ;;
    --restore-only) RESTORE_ONLY=1; shift ;;
    --temperature) TEMPERATURE=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --engines) ENGINES=$2; shift 2 ;;
    --start-together) TOGETHER=1; shift ;;
    --extra) EXTRA+=(--extra "$2"); shift 2 ;;
    --extra-only) EXTRA+=(--extra-only); shift ;;
    --turns) [ "$2" = later ] || { echo "--turns takes only 'later'" >&2; exit 2; }; PROMPTS=.later; shift 2 ;;
    *) echo "smollm2_regenerate.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$RESTORE_ONLY" ] && SERIES=none
BACKEND="${REGEN_BACKEND:-vllm}"; [ "$BACKEND" = vllm ] || SERIES=none
case "$SERIES" in none|0.26|0.34) ;; *) echo "--vllm must be 0.26 or 0.34, got $SERIES" >&2; exit 2 ;; esac
D=artifacts/smollm2-data ALL=artifacts/smollm2-data/all.$TAG.jsonl
if ls "$CARRY_DIR"/smollm2_$TAG.tgz.* >/dev/null 2>&1 && [ ! -f $ALL ]; then
  cat "$CARRY_DIR"/smollm2_$TAG.tgz.* | tar -xz -C $D && echo "restored $(wc -l <$ALL) answers"
  wc -l <$ALL >$ALL.restored_rows  # smollm2_pack.sh ships the answers again only if this run added some
fi
[ -z "$RESTORE_ONLY" ] || [ -f $ALL ] || { echo "--restore-only: no shipped answers ($ALL)" >&2; exit 2; }
[ -n "$RESTORE_ONLY" ] || python3 lab/gpu/regen_prompts.py --target artifacts/smollm2-135m-instruct \
  --data-dir $D --suffix "$PROMPTS" --samples "$SAMPLES" "${EXTRA[@]}" --json "$OUT/regen_prompts_$TAG.json"
# vLLM only now: the prompt file above (a minute for the later turns) is built while it arrives.
case "$SERIES" in
  0.26) wait_for_vllm ;;
  0.34) source lab/gpu/vllm034_install.sh; wait_for_vllm034 ;;
esac
# vLLM's engine core in a process of its own (its default; env.sh's wait_for_vllm keeps it in
# process for readable tracebacks): at 512 running requests the step loop is bound by the host
# (16.9k answer tokens/s with CUDA graphs vs about 15k eager, 2026-12-04), and in one process the
# loop also builds every step's outputs.
unset VLLM_ENABLE_V1_MULTIPROCESSING
regenerate() {  # regenerate [ARGS...]: the target answers the prompt file into $ALL (or a shard)
  python3 -m train.prepare.regenerate --target artifacts/smollm2-135m-instruct --data $D/prompts.jsonl \
    --out $ALL --backend "$BACKEND" ${REGEN_MAX_ROWS:+--max-rows $REGEN_MAX_ROWS} --temperature "$TEMPERATURE" \
    --top-p 0.8 --max-new-tokens "${REGEN_MAX_NEW_TOKENS:-512}" ${GRAPHS:+--vllm-cuda-graphs --vllm-max-num-seqs 512} "$@" 2>&1 |
    grep --line-buffered -v "it/s\]"
}
wait_built() {  # K PID READY_FILE: until engine K is built or its process ended, then say which
  while [ ! -f "$3" ] && kill -0 $2 2>/dev/null; do sleep 2; done
  echo "engine $1: $([ -f "$3" ] && echo "built after $((SECONDS - start)) s" || echo "ended before it was built")"
}
if [ -n "$RESTORE_ONLY" ]; then :
elif [ "$ENGINES" = 1 ]; then
  regenerate --batch-size 4096 ${MAX_SECONDS:+--max-seconds $MAX_SECONDS} ${MEMORY:+--vllm-gpu-memory $MEMORY}
else
  share=$(python3 -c "print(round(${MEMORY:-0.9} / $ENGINES, 3))") start=$SECONDS pids=()
  for k in $(seq 0 $((ENGINES - 1))); do
    left=""; [ -z "$MAX_SECONDS" ] || left=$((MAX_SECONDS - (SECONDS - start)))
    [ -z "$left" ] || [ "$left" -gt 30 ] || { echo "engine $k not started: ${left}s left"; break; }
    ready=$D/.engine$k.ready; rm -f "$ready"
    # Engines that start together compile together: each but the first gets a vLLM compile cache
    # of its own, so none reads another's half-written artifacts.
    cache=${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}; [ -z "$TOGETHER" ] || [ $k = 0 ] || cache=/tmp/vllm-cache-engine$k
    VLLM_CACHE_ROOT=$cache regenerate --batch-size "${REGEN_CHUNK:-1024}" --shard "$k/$ENGINES" \
      --vllm-gpu-memory "$share" ${TOGETHER:+--vllm-kv-cache-gib ${REGEN_KV_GIB:-16}} \
      --ready-file "$ready" ${left:+--max-seconds $left} >"$OUT/regenerate_${TAG}_engine$k.log" &
    pids+=($!)
    [ -n "$TOGETHER" ] || wait_built $k $! "$ready"
  done
  if [ -n "$TOGETHER" ]; then
    for k in "${!pids[@]}"; do wait_built $k ${pids[$k]} $D/.engine$k.ready; done
  fi
  wait
  python3 -m train.prepare.regenerate --target artifacts/smollm2-135m-instruct --out $ALL --join-shards "$ENGINES"
  python3 -c "import json; s = json.load(open('$ALL.summary.json')); print(f\"{s['engines']} engines: {s['written_this_run']} answers in {s['seconds_this_run']} s\")"
fi
python3 - "$TAG" <<'PY'
import json, sys
D, tag = "artifacts/smollm2-data", sys.argv[1]
files = {s: open(f"{D}/{s}.{tag}.jsonl", "w") for s in ("train", "heldout")}
for line in open(f"{D}/all.{tag}.jsonl"):
    files[json.loads(line)["split"]].write(line)
for f in files.values():
    f.close()
summary = json.load(open(f"{D}/all.{tag}.jsonl.summary.json"))
for s in files:  # distill reads PATH.summary.json into the checkpoint's provenance
    json.dump({**summary, "split": s}, open(f"{D}/{s}.{tag}.jsonl.summary.json", "w"), indent=2)
PY
S=regenerate_summary.json; [ "$TAG" = regen ] || S=regenerate_${TAG}_summary.json
cp $ALL.summary.json "$OUT/$S"; wc -l $D/*.$TAG.jsonl
