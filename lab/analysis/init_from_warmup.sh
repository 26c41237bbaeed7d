#!/usr/bin/env bash
# What the first steps of an `init_from` run do to a trained draft, by warm-up (CPU, ~3 min):
# three steps of smollm2_dspark_16k_continued from DRAFT on the first 50 training rows, one row a
# step, and the held-out analytic tau after them (16 held-out rows), at
#   lr0      optim.lr=0: the draft as it came (the run's step-0 figure, printed beside each row)
#   warmup1  the run's own schedule over 3 steps: warm-up round(0.04 x 3) -> 1 step, full rate at once
#   warmup160  warm-up over 160 steps, as the first steps of a 4,000-step run have
# The optimizer starts empty in an init_from run, and Adam's first update moves every weight by
# about the learning rate whatever its gradient's size.
#   bash lab/analysis/init_from_warmup.sh DRAFT TARGET TRAIN.jsonl HELDOUT.jsonl OUT
set -euo pipefail; cd "$(dirname "$0")/../.."
DRAFT=${1:?DRAFT} TARGET=${2:?TARGET} TRAIN=${3:?TRAIN} HELDOUT=${4:?HELDOUT} OUT=${5:?OUT}
source lab/analysis/cpu_overrides.sh
mkdir -p "$OUT"; T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
head -50 "$TRAIN" >"$T/train50.jsonl"; head -16 "$HELDOUT" >"$T/heldout16.jsonl"
run() {  # NAME OVERRIDE...
  local name=$1; shift
  python3 -m train.distill +experiment=smollm2_dspark_16k_continued "${CPU_OVERRIDES[@]}" \
    init_from="$DRAFT" target.path="$TARGET" data.train="$T/train50.jsonl" \
    data.heldout="$T/heldout16.jsonl" data.num_proc=1 trainer.max_steps=3 trainer.micro_batch_size=1 \
    trainer.num_anchors=64 trainer.eval_every=3 trainer.eval_batches=1 trainer.save_every=0 \
    trainer.progress=false output_dir="$OUT/$name" overwrite=true "$@" >"$OUT/$name.log" 2>&1
  cp "$OUT/$name/summary.json" "$OUT/$name.summary.json"; rm -rf "$OUT/$name"  # 625 MB of weights
}
run lr0 optim.lr=0
run warmup1
run warmup160 optim.warmup_ratio=53.4
python3 - "$OUT" lr0 warmup1 warmup160 <<'PY' | tee "$OUT/table.md"
import json, sys
print("| run | held-out analytic tau after 3 steps | the draft before them |\n|---|---|---|")
for n in sys.argv[2:]:
    s = json.load(open(f"{sys.argv[1]}/{n}.summary.json"))
    print(f"| {n} | {s['eval']['analytic_tau']:.3f} | {s['eval_untrained']['analytic_tau']:.3f} |")
PY
