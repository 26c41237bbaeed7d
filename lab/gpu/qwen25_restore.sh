#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B: put back the stage folders qwen25_ship.sh packed (regenerate, distill)
# under the recipe's folder, after waiting up to WAIT_S seconds (default 0) for every part that
# PARTS_DIR/SHA256SUMS names and checking each; a missing or altered part is an error naming it,
# and nothing is extracted then. On the host of a serving session PARTS_DIR is where the carries
# land ($CARRY_DIR/q25s); here, the folder the polls returned the parts to.
#   bash lab/gpu/qwen25_restore.sh PARTS_DIR [WAIT_S]
set -euo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
P="${1:?usage: qwen25_restore.sh PARTS_DIR [WAIT_S]}" WAIT_S="${2:-0}"
R="${RECIPE_OUT:-artifacts/recipes/qwen2.5-coder-1.5b-instruct}"
wait_for_files "$WAIT_S" "$P/SHA256SUMS" || exit 1
mapfile -t PARTS < <(awk -v d="$P" '{print d "/" $2}' "$P/SHA256SUMS" | sort)
wait_for_files "$WAIT_S" "${PARTS[@]}" || exit 1
(cd "$P" && sha256sum --quiet -c SHA256SUMS) || { echo "a part above does not match SHA256SUMS" >&2; exit 1; }
mkdir -p "$R" && rm -rf "$R/regenerate" "$R/distill"
cat "${PARTS[@]}" | gzip -dc | tar -xf - -C "$R"
echo "restored into $R:"; du -sh "$R/regenerate" "$R/distill"
