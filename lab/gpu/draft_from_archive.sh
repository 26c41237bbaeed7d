#!/usr/bin/env bash
# A trained draft carried in as one archive (smollm2_pack.sh's NAME_final.tgz.* parts joined, packed
# with carry_pieces.py): wait up to 10 minutes for it in /tmp/carry, where it appears only whole
# and with its sha256 checked, and unpack its final/ folder under DIR, where serving and
# evaluation stages read DIR/final and `init_from=DIR/final` trains on from it.
#   bash lab/gpu/draft_from_archive.sh ARCHIVE DIR
set -euo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
A="$CARRY_DIR/${1:?usage: draft_from_archive.sh ARCHIVE DIR}" DIR="${2:?usage: draft_from_archive.sh ARCHIVE DIR}"
wait_for_files 600 "$A" || { echo "the draft archive $A never arrived" >&2; exit 1; }
[ "$(tar -tzf "$A" | grep -v '^final/' | head -1)" = "" ] ||
  { echo "$A holds more than a final/ folder" >&2; exit 1; }
mkdir -p "$DIR" && rm -rf "$DIR/final" && tar -xzf "$A" -C "$DIR"
[ -f "$DIR/final/config.json" ] && [ -f "$DIR/final/model.safetensors" ] ||
  { echo "$A has no final/config.json and final/model.safetensors" >&2; exit 1; }
ls -la "$DIR/final"
