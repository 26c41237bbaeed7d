#!/usr/bin/env bash
# CPU side: a trained draft folder (default outputs/smollm2_dspark/final, 64 MB) and the held-out
# ShareGPT/HumanEval prompts, as two git-ignored folders, so a session serves and gates a draft
# without retraining it:
#   .dr1  the draft's small files, its weights' first DR1_BYTES (default 12,000,000), the two
#         held-out .jsonl.gz of .data and SHA256SUMS.draft
#   .dr2  the rest of the weights
# Pack them with the session's other carries (carry_pieces.py pack ... carry=.dr1 carry=.dr2): on
# the device their files land in /tmp/carry; smollm2_target.sh unpacks the held-out rows,
# draft_from_carry.sh rebuilds and checks the draft.
set -euo pipefail
DRAFT="${1:-outputs/smollm2_dspark/final}"; DR1_BYTES="${DR1_BYTES:-12000000}"
[ -f "$DRAFT/model.safetensors" ] || { echo "no $DRAFT/model.safetensors: train or fetch it first" >&2; exit 1; }
for f in .data/sharegpt-heldout.jsonl.gz .data/humaneval-heldout.jsonl.gz; do
  [ -f "$f" ] || { echo "no $f: run lab/gpu/prepare_carry.sh first" >&2; exit 1; }
done
for f in .dr1 .dr2; do grep -qxF "/$f/" .git/info/exclude || echo "/$f/" >>.git/info/exclude; done
rm -rf .dr1 .dr2; mkdir -p .dr1 .dr2
for f in "$DRAFT"/*; do [ "$(basename "$f")" = model.safetensors ] || cp "$f" .dr1/draft.$(basename "$f"); done
head -c "$DR1_BYTES" "$DRAFT/model.safetensors" >.dr1/draft.weights.00
tail -c +$((DR1_BYTES + 1)) "$DRAFT/model.safetensors" >.dr2/draft.weights.01
(cd "$DRAFT" && sha256sum model.safetensors) >.dr1/SHA256SUMS.draft
cp .data/sharegpt-heldout.jsonl.gz .data/humaneval-heldout.jsonl.gz .dr1/
du -sh .dr1 .dr2
