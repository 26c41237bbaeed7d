#!/usr/bin/env bash
# SmolLM2, stage 5: the trained DSpark draft (and the regenerated data) as < 16 MB parts under
# $OUT/ship, which poll.sh returns a few at a time (the draft's first), so a later session can serve
# it without retraining.
#   bash scripts/gpu/smollm2_pack.sh [EXPERIMENT]    (default smollm2_dspark: dspark_final.tgz.*;
#                                                     another: EXPERIMENT_final.tgz.*)
# Rebuild here with: cat NAME.tgz.* | tar -xz   (sha256 in ship/SHA256SUMS).
set -euo pipefail; cd "$(dirname "$0")/../.."
EXP="${1:-smollm2_dspark}"; NAME=$([ "$EXP" = smollm2_dspark ] && echo dspark || echo "$EXP")
mkdir -p "$OUT/ship" && cd "$OUT/ship"
tar -czf - -C "$OLDPWD/outputs/$EXP" final | split -b 15000000 -d - "${NAME}_final.tgz."
regen="$OLDPWD/artifacts/smollm2-data/train.regen.jsonl"  # absent in the off-policy pipeline
[ -f "$regen" ] && tar -czf - -C "$OLDPWD/artifacts/smollm2-data" train.regen.jsonl \
  heldout.regen.jsonl all.regen.jsonl.summary.json | split -b 15000000 -d - smollm2_regen.tgz.
sha256sum ./*.tgz.* >SHA256SUMS; ls -la
