#!/usr/bin/env bash
# vLLM 0.26 + the dependencies the GPU image lacks into /tmp/vsite, from the parts that
# ../shared/device/vllm026/prepare.sh made (.c1-.c3 copied to /tmp/vx by three earlier calls,
# .c4 carried by this one). /tmp/vsite/.ready tells vllm_gate.sh it can start.
set -euo pipefail
cp .c4/* /tmp/vx/
cd /tmp/vx && cat vllmpart.0* >vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vx/*.whl
touch /tmp/vsite/.ready && echo "vLLM installed in /tmp/vsite"
