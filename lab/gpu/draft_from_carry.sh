#!/usr/bin/env bash
# Device side of prepare_draft_carry.sh: wait (up to 10 min) for both parts of the carried draft in
# /tmp/carry, rebuild model.safetensors, check its sha256 and put the folder at $1 (default
# outputs/smollm2_dspark/final), where the serve and gate stages read it.
set -euo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
C=$CARRY_DIR; DST="${1:-outputs/smollm2_dspark/final}"
wait_for_files 600 $C/draft.weights.01 $C/SHA256SUMS.draft ||
  { echo "the draft's second part (.dr2) never arrived in $C" >&2; exit 1; }
mkdir -p "$DST"
cat $C/draft.weights.0* >"$DST/model.safetensors"
for f in $C/draft.*; do
  case "$f" in */draft.weights.*) ;; *) cp "$f" "$DST/${f#$C/draft.}" ;; esac
done
(cd "$DST" && sha256sum -c $C/SHA256SUMS.draft)
ls -la "$DST"
