#!/usr/bin/env bash
# Split each named carry folder's files into two folders, FOLDERa and FOLDERb (the file's halves as
# NAMEa / NAMEb), for carries that no longer fit one device call beside the working tree: the
# 64 MiB of a call counts the tracked files too (8 MB on 2026-12-04), and vLLM 0.26's .c1/.c2 hold
# 60,000,000 bytes each. vllm_install.sh joins `vllmpart.0*` in name order, so 00a, 00b, 01a, ...
# join back to the same wheel.
#   bash scripts/gpu/halve_carry.sh .c1 .c2        then carry .c1a, .c1b, .c2a, .c2b, one a call
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: halve_carry.sh FOLDER..." >&2; exit 2; }
for dir in "$@"; do
  dir="${dir%/}"; [ -d "$dir" ] || { echo "no folder $dir" >&2; exit 2; }
  rm -rf "${dir}a" "${dir}b"; mkdir -p "${dir}a" "${dir}b"
  for f in "$dir"/*; do
    half=$(( ($(stat -c %s "$f") + 1) / 2 ))
    head -c "$half" "$f" >"${dir}a/$(basename "$f")a"
    tail -c +"$((half + 1))" "$f" >"${dir}b/$(basename "$f")b"
    cat "${dir}a/$(basename "$f")a" "${dir}b/$(basename "$f")b" | cmp -s - "$f" ||
      { echo "the halves of $f do not join back to it" >&2; exit 1; }
  done
  du -sh "${dir}a" "${dir}b"
done
