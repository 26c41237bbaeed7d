#!/usr/bin/env bash
# Does a draft learn faster from the target's own layers? At today's budgets held-out tau follows
# the training a session affords (779680f:docs/benchmarks.md, "Time-boxed runs"), so a better start is
# worth as much as more minutes. Two drafts of the embedded default (`+experiment=tiny`, 150 steps,
# a 2-layer draft against the 4-layer tiny target) per seed: fresh layers, and layers copied from
# the target's last two (`init_layers_from_target=[-2,-1]`, train/init/layer_init.py); everything else
# the same. Printed: held-out analytic tau and greedy tau (train.distill's final evaluation) per arm.
# Criterion, fixed before the run: the copy is worth a SmolLM2 A/B on the GPU only if its held-out
# analytic tau beats the fresh arm's by >= 3% at every seed.
#   bash lab/analysis/layer_init_tiny.sh OUT_DIR [SEED...]     (default seeds 0 1; ~4 min a run, 2 CPU cores)
set -euo pipefail; cd "$(dirname "$0")/../.."
OUT=${1:?usage: layer_init_tiny.sh OUT_DIR [SEED...]}; shift; mkdir -p "$OUT"
SEEDS=("$@"); [ ${#SEEDS[@]} -gt 0 ] || SEEDS=(0 1)
for seed in "${SEEDS[@]}"; do
  for arm in fresh last2; do
    extra=(); [ $arm = fresh ] || extra=("init_layers_from_target=[-2,-1]")
    python -m train.distill +experiment=tiny overwrite=true trainer.progress=false seed=$seed \
      experiment_name=$arm output_dir="$OUT/${arm}_s$seed" "${extra[@]}" >"$OUT/${arm}_s$seed.log" 2>&1
  done
done
python - "$OUT" "${SEEDS[@]}" <<'PY'
import json, sys
out, seeds = sys.argv[1], sys.argv[2:]
rows = {}
print(f"{'seed':>4} {'arm':>6} {'analytic tau':>13} {'greedy tau':>11}")
for s in seeds:
    for arm in ("fresh", "last2"):
        f = json.load(open(f"{out}/{arm}_s{s}/summary.json"))["eval"]
        rows[(s, arm)] = f
        print(f"{s:>4} {arm:>6} {f['analytic_tau']:>13.3f} {f['greedy_tau']:>11.3f}")
ratios = [rows[(s, 'last2')]['analytic_tau'] / rows[(s, 'fresh')]['analytic_tau'] for s in seeds]
print("last2 / fresh, analytic tau per seed:", " ".join(f"{r:.3f}" for r in ratios))
print("criterion (>= 1.03 at every seed):", "met" if min(ratios) >= 1.03 else "not met")
json.dump({f"{s}/{a}": v for (s, a), v in rows.items()} | {"ratios": ratios},
          open(f"{out}/layer_init.json", "w"), indent=2)
PY
