#!/usr/bin/env bash
# Fetch the vLLM 0.34.0 source files the oracle tests execute (tests/vllm_oracle.py), plus the
# Triton package whose CPU interpreter (TRITON_INTERPRET=1) runs vLLM's own kernels on CPU.
#
# Into an ignored folder, never the repo: .vllm_oracle/ (VLLM_ORACLE_DIR to change it). Only the
# named .py files are unzipped from the wheel; the wheel itself goes to a temporary folder
# (VLLM_WHEEL_DIR: reuse a folder that already holds vllm-0.34.0-*.whl). Re-running is a no-op
# once the stamp matches. Tests that need these files skip cleanly when they are absent.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${VLLM_ORACLE_DIR:-$REPO/.vllm_oracle}"
VLLM_VERSION="0.34.0"
TRITON_VERSION="3.9.0"
FILES=(
    vllm/v1/worker/gpu/spec_decode/adaptive_verification.py
    vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py
    vllm/v1/worker/gpu/spec_decode/dspark/speculator.py
)
STAMP="vllm=$VLLM_VERSION triton=$TRITON_VERSION files=${FILES[*]}"
if [[ -f "$DEST/.stamp" && "$(cat "$DEST/.stamp")" == "$STAMP" ]]; then
    exit 0
fi
rm -rf "$DEST" && mkdir -p "$DEST/src"
if [[ -n "${VLLM_WHEEL_DIR:-}" ]]; then
    WHEELS="$VLLM_WHEEL_DIR"
else
    # Our own temporary folder goes when we exit: the wheel is 228 MB, and one left per CI run
    # filled the disk.
    WHEELS="$(mktemp -d)"
    trap 'rm -rf "$WHEELS"' EXIT
fi
if ! ls "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps "vllm==$VLLM_VERSION" -d "$WHEELS"
fi
python3 - "$DEST/src" "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl "${FILES[@]}" <<'PY'
import sys, zipfile
dest, wheel, *files = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for f in files:
        z.extract(f, dest)
PY
python3 -m pip install -q --no-deps --target "$DEST/triton" "triton==$TRITON_VERSION"
echo "$STAMP" > "$DEST/.stamp"
echo "vLLM $VLLM_VERSION oracle files in $DEST"
