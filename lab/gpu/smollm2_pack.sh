#!/usr/bin/env bash
# SmolLM2: what a lost machine must not take with it, as < 16 MB parts under $OUT/ship, which
# poll.sh returns a few at a time (in name order), so a later session starts from there.
#   bash lab/gpu/smollm2_pack.sh data          the regenerated answers, one archive a tag
#                                                  (smollm2_regenerate.sh --tag, default regen):
#                                                  all.TAG.jsonl and its summary as
#                                                  smollm2_TAG.tgz.*. Carried back into /tmp/carry,
#                                                  smollm2_regenerate.sh restores them and resumes
#                                                  after them.
#   bash lab/gpu/smollm2_pack.sh [EXPERIMENT]  the trained draft (default smollm2_dspark:
#                                                  dspark_final.tgz.*; another: EXPERIMENT_final.tgz.*),
#                                                  and the answers if `data` has not shipped them.
# Rebuild here with: cat NAME.tgz.* | tar -xz   (sha256 in ship/SHA256SUMS).
set -euo pipefail; cd "$(dirname "$0")/../.."
REPO=$PWD D=$PWD/artifacts/smollm2-data; mkdir -p "$OUT/ship" && cd "$OUT/ship"
pack_data() {  # absent in the off-policy pipeline; each tag shipped once
  local f tag
  for f in "$D"/all.*.jsonl; do
    [ -f "$f" ] || continue
    tag=${f##*/all.}; tag=${tag%.jsonl}
    [ -f "smollm2_$tag.tgz.00" ] && continue
    # restored from a carried-in archive and nothing added since: shipped before
    [ -f "$f.restored_rows" ] && [ "$(cat "$f.restored_rows")" = "$(wc -l <"$f")" ] && continue
    tar -czf - -C "$D" "all.$tag.jsonl" "all.$tag.jsonl.summary.json" | split -b 15000000 -d - "smollm2_$tag.tgz."
  done
}
if [ "${1:-}" = data ]; then
  pack_data
else
  EXP="${1:-smollm2_dspark}"; NAME=$([ "$EXP" = smollm2_dspark ] && echo dspark || echo "$EXP")
  tar -czf - -C "$REPO/outputs/$EXP" final | split -b 15000000 -d - "${NAME}_final.tgz."
  pack_data
fi
if ls ./*.tgz.* >/dev/null 2>&1; then sha256sum ./*.tgz.* >SHA256SUMS; else echo "nothing new to pack"; fi
ls -la
