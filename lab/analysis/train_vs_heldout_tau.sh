#!/usr/bin/env bash
# A trained draft's analytic tau on rows it trained on against held-out rows, by the trainer's own
# evaluation (the same anchors, loss mask and packing as the held-out figure a run prints): the
# over-fitting check, where a run's training-batch tau pulls away from its held-out one.
#   bash lab/analysis/train_vs_heldout_tau.sh OUT TRAIN.jsonl HELDOUT.jsonl ROWS BATCHES NAME=EXPERIMENT:DRAFT...
# ROWS rows of TRAIN.jsonl, drawn at random with seed 0 (the file's `split` field is ignored), and
# HELDOUT.jsonl as it is; each evaluated over its first BATCHES packed batches of 2 sequences
# (trainer.eval_batches), on this machine's CPU. The trainer has no evaluation-only mode: each
# evaluation is a 1-step run at learning rate 0 from the draft (init_from), whose step-0 and
# final evaluations are the same draft's (tests/integration/test_warm_start.py checks that the step changes
# no weight). One run a set and draft, in turn; about 7 minutes each on 2 cores at BATCHES=6 for
# SmolLM2. Prints a table, NAME by set; the logs and each run's summary.json stay under OUT.
set -euo pipefail; cd "$(dirname "$0")/../.."
[ $# -ge 6 ] || { sed -n 2,12p "$0" >&2; exit 2; }
OUT=$1 TRAIN=$2 HELDOUT=$3 ROWS=$4 BATCHES=$5; shift 5
mkdir -p "$OUT"
ROWS_DIR=$(mktemp -d); trap 'rm -rf "$ROWS_DIR"' EXIT
python3 - "$TRAIN" "$ROWS" "$ROWS_DIR/train.jsonl" <<'PY'
import random, sys
rows = open(sys.argv[1]).readlines()
random.Random(0).shuffle(rows)
open(sys.argv[3], "w").writelines(rows[: int(sys.argv[2])])
PY
cp "$HELDOUT" "$ROWS_DIR/heldout.jsonl"
source lab/analysis/cpu_overrides.sh
EVAL_ONLY=(trainer.micro_batch_size=2 trainer.eval_batches="$BATCHES" trainer.max_steps=1 optim.lr=0
  data.num_proc=1 trainer.progress=false)
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}; exp=${rest%%:*} draft=${rest#*:}
  for set in train heldout; do
    run="$OUT/${name}_$set"
    python3 -m train.distill +experiment="$exp" "${CPU_OVERRIDES[@]}" "${EVAL_ONLY[@]}" init_from="$draft" \
      data.train="$ROWS_DIR/train.jsonl" data.heldout="$ROWS_DIR/$set.jsonl" \
      output_dir="$run" overwrite=true >"$run.log" 2>&1 || { tail -5 "$run.log" >&2; exit 1; }
    cp "$run/summary.json" "$run.summary.json"
    rm -rf "$run"
  done
done
python3 - "$OUT" "$@" <<'PY'
import json, sys
out, names = sys.argv[1], [s.split("=", 1)[0] for s in sys.argv[2:]]
tau = {
    (n, s): json.load(open(f"{out}/{n}_{s}.summary.json"))["eval"]["analytic_tau"]
    for n in names for s in ("train", "heldout")
}
print("| draft | analytic tau, train rows | held-out rows | train / held-out |")
print("|---|---|---|---|")
for n in names:
    print(f"| {n} | {tau[n, 'train']:.3f} | {tau[n, 'heldout']:.3f} | {tau[n, 'train'] / tau[n, 'heldout']:.3f} |")
if len(names) == 2:
    a, b = names
    print(f"\n{a} / {b}: train rows {tau[a, 'train'] / tau[b, 'train']:.3f}, "
          f"held-out rows {tau[a, 'heldout'] / tau[b, 'heldout']:.3f}")
PY
