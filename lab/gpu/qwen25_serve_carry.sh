#!/usr/bin/env bash
# Here (CPU), for lab/gpu/qwen25_serve_session.stages: a draft trained in an earlier session, as
# carry folders .q25s_01 .. .q25s_NN (three 15 MB parts each, SHA256SUMS in the first).
# First put the shipped parts back under the recipe folder:
#   bash lab/gpu/qwen25_restore.sh DIR_WITH_THE_POLLED_PARTS
# then
#   bash lab/gpu/qwen25_serve_carry.sh
# Each call of the session carries one folder and copies it to /tmp/carry/q25s; the pipeline's
# restore stage waits for every part SHA256SUMS names.
set -euo pipefail; cd "$(dirname "$0")/../.."
S=$(mktemp -d "${TMPDIR:-/tmp}/q25s.XXXX"); trap 'rm -rf "$S"' EXIT
bash lab/gpu/qwen25_ship.sh "$S" >/dev/null
rm -rf .q25s_[0-9][0-9]
i=0; n=0
for f in "$S"/q25_stages.tar.gz.*; do
  [ $((n % 3)) = 0 ] && { i=$((i + 1)); mkdir "$(printf .q25s_%02d $i)"; }
  mv "$f" "$(printf .q25s_%02d $i)/"; n=$((n + 1))
done
cp "$S/SHA256SUMS" .q25s_01/
python3 lab/gpu/check_carries.py .q25s_?? >/dev/null  # each folder with the tree within a call
echo "$i folders, $n parts:"; du -sh .q25s_?? | tr '\n' ' '; echo
