#!/usr/bin/env bash
# Issue 9, the 4th back-to-back call of ../shared/device/vllm026/README.md (after three calls that
# copy .c1-.c3 to /tmp/vx): install vLLM 0.26 + deps into /tmp/site, then run the serve-time
# acceptance gate on the small target + DSpark draft trained by issue7_*.sh (still on the machine),
# or on the carried tiny pair: TARGET=artifacts/tiny-target DRAFT=outputs/tiny/final.
set -uo pipefail; cd "$(dirname "$0")/../.."
cp .c4/* /tmp/vx/ && cd /tmp/vx && cat vllmpart.0* > vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/vx/*.whl
cd - >/dev/null; source scripts/gpu/env.sh
python3 scripts/gpu/vllm_vs_engine.py --target "${TARGET:-artifacts/small-target}" \
  --draft "${DRAFT:-outputs/small_gpu/final}" --json "$OUT/vllm_gate.json" "$@" 2>&1 \
  | grep -v "it/s" | tail -60 | tee "$OUT/vllm_gate.txt"
