#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B: what a lost machine must not take with it, as < 16 MB parts under
# $OUT/ship that poll.sh returns a few a poll: the regenerated answers first (small), then the
# draft. Rebuild here with `cat NAME.tgz.* | tar -xz` (sha256 in ship/SHA256SUMS); given back to
# a host under the recipe's folder, a rerun of the recipe command continues from them.
set -euo pipefail; cd "$(dirname "$0")/../.."
R="$PWD/${RECIPE_OUT:-artifacts/recipes/qwen2.5-coder-1.5b-instruct}"
mkdir -p "$OUT/ship" && cd "$OUT/ship"
tar -czf - -C "$R" regenerate | split -b 15000000 -d - q25_regenerate.tgz.
tar -cf - -C "$R/distill/run" final | split -b 15000000 -d - q25_draft.tar.
sha256sum ./q25_* >SHA256SUMS
ls -la | tail -5; du -sh .
