#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B: the recipe's regenerate and distill stage folders, done.json included, as
# < 16 MB parts q25_stages.tar.NN + SHA256SUMS in DEST, so that a lost machine takes nothing the
# next one needs: given back under another machine's recipe folder (qwen25_restore.sh), with the
# target rebuilt there from its parts, the same recipe command finds both stages done and goes on
# to evaluate and export (train/recipe/state.py: checkpoints are scratch, a named target is keyed
# by its settings). Left out: distill/run/checkpoints (optimizer state); final-speculators'
# weights, byte-identical to final's, travel once (a hard link inside the tar).
#   bash lab/gpu/qwen25_ship.sh [DEST]     (default $OUT/ship, which poll.sh returns 4 parts a poll)
# About 250 MB for the 3-layer 32k-vocabulary draft in bf16 plus the gzipped answers.
set -euo pipefail; cd "$(dirname "$0")/../.."
R=$(realpath -m "${RECIPE_OUT:-artifacts/recipes/qwen2.5-coder-1.5b-instruct}")
DEST="${1:-${OUT:-gpu-out}/ship}"
for s in regenerate distill; do
  [ -f "$R/$s/done.json" ] || { echo "qwen25_ship.sh: $R/$s is not done" >&2; exit 1; }
done
STAGING=$(mktemp -d "${TMPDIR:-/tmp}/q25ship.XXXX"); trap 'rm -rf "$STAGING"' EXIT
cp -al "$R/regenerate" "$R/distill" "$STAGING/"  # links, not copies: no second 250 MB on disk
rm -rf "$STAGING/distill/run/checkpoints"
a="$STAGING/distill/run/final/model.safetensors" b="$STAGING/distill/run/final-speculators/model.safetensors"
[ -f "$b" ] && cmp -s "$a" "$b" && ln -f "$a" "$b"
mkdir -p "$DEST" && rm -f "$DEST"/q25_stages.tar.*
tar -cf - -C "$STAGING" regenerate distill | gzip -1 | split -b 15000000 -d - "$DEST/q25_stages.tar.gz."
(cd "$DEST" && sha256sum q25_stages.tar.gz.* >SHA256SUMS)
ls -la "$DEST" | tail -4; du -sh "$DEST"
