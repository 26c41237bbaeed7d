#!/usr/bin/env bash
# vLLM 0.26 + the dependencies the GPU image lacks into /tmp/vsite, from the files that
# ../shared/device/vllm026/prepare.sh made (.c1-.c4), packed for `vx` by carry_pieces.py and
# joined into /tmp/vx by session.sh, which runs this once all of them are in.
# /tmp/vsite/.ready tells the vLLM stages they can start.
set -euo pipefail
VX="${VX_DIR:-/tmp/vx}"
cd "$VX" && cat vllmpart.0* >vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
# A part lost with a failed call (2026-12-05: the first call got no machine) leaves a wheel that pip
# rejects with "OSError: [Errno 22] Invalid argument": name the parts instead.
python3 -c "import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)" \
  vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl 2>/dev/null ||
  { echo "vLLM's wheel does not join from the parts here ($(ls vllmpart.0* | tr '\n' ' ')): a carry call missed" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite "$VX"/*.whl
touch /tmp/vsite/.ready && echo "vLLM installed in /tmp/vsite"
