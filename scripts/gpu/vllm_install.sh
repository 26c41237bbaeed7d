#!/usr/bin/env bash
# vLLM 0.26 + the dependencies the GPU image lacks into /tmp/vsite, from the parts that
# ../shared/device/vllm026/prepare.sh made (.c1-.c3 copied to /tmp/vx by three earlier calls,
# .c4 carried by this one). /tmp/vsite/.ready tells vllm_gate.sh it can start.
set -euo pipefail
cp .c4/* /tmp/vx/
cd /tmp/vx && cat vllmpart.0* >vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
# A part lost with a failed call (2026-12-05: the first call got no machine) leaves a wheel that pip
# rejects with "OSError: [Errno 22] Invalid argument": name the parts instead.
python3 -c "import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)" \
  vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl 2>/dev/null ||
  { echo "vLLM's wheel does not join from the parts here ($(ls vllmpart.0* | tr '\n' ' ')): a carry call missed" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vx/*.whl
touch /tmp/vsite/.ready && echo "vLLM installed in /tmp/vsite"
