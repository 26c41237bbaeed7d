#!/usr/bin/env bash
# Device side of issue 19: vLLM 0.34.0 + torch 2.14.0 into their own directory, /tmp/v34site, from the
# parts that lab/gpu/vllm034_prepare.sh split into .v34_01 .. .v34_NN (one carry folder per device
# call; lab/gpu/vllm034_calls.py prints the calls, which copy each folder to /tmp/v34).
#
# Run (in the repo root, in the call that carries the last folder, after copying it to /tmp/v34):
#   bash lab/gpu/vllm034_install.sh            reassemble, verify every sha256 against V34_MANIFEST,
#                                                  pip install --target /tmp/v34site, prove the stack on
#                                                  the GPU, touch /tmp/v34site/.ready
#   bash lab/gpu/vllm034_install.sh --verify-only [DIR...]
#                                                  copy the DIRs' files (if any) into $V34_DIR, reassemble
#                                                  and verify; no install (runs on a CPU machine too)
#   bash lab/gpu/vllm034_install.sh --prove    the proof alone, on an installed /tmp/v34site
# Source it to use vLLM 0.34 by PYTHONPATH (after env.sh, instead of its wait_for_vllm, which is 0.26):
#   source lab/gpu/vllm034_install.sh; use_vllm034        # fails unless /tmp/v34site/.ready
#   source lab/gpu/vllm034_install.sh; wait_for_vllm034   # waits up to 20 min for .ready first
# Environment: V34_DIR (default /tmp/v34) holds the parts and the reassembled wheels, V34_SITE (default
# /tmp/v34site) the installed packages.
V34_DIR="${V34_DIR:-/tmp/v34}"
V34_SITE="${V34_SITE:-/tmp/v34site}"

# The environment every vLLM 0.34 process here needs. The image's cuDNN (9.19, inferred from torch 2.11's
# pin) is older than the 9.24 torch 2.14 was built with: same symbols, but torch.backends.cudnn refuses a
# runtime minor below the build's unless told; text serving on Hopper does not run cuDNN kernels.
use_vllm034() {
  [ -f "$V34_SITE/.ready" ] || { echo "vLLM 0.34 is not installed in $V34_SITE (no .ready)" >&2; return 1; }
  export PYTHONPATH="$V34_SITE${PYTHONPATH:+:$PYTHONPATH}" VLLM_ENABLE_V1_MULTIPROCESSING=0
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  # FlashInfer's precompiled sampler kernels are not carried (flashinfer-cubin / -jit-cache): vLLM
  # warned that it would JIT-compile them at start-up ("several minutes"), and the first engine was
  # still starting 75 s after loading its weights when the session's device time ended (2026-12-03).
  # vLLM's own PyTorch top-k/top-p path needs no compile.
  export VLLM_USE_FLASHINFER_SAMPLER=0
}
wait_for_vllm034() {
  local _
  for _ in $(seq 240); do [ -f "$V34_SITE/.ready" ] && break; sleep 5; done
  use_vllm034
}

# Check every part named in the manifest (present, size, sha256), then rebuild each wheel from its parts and
# check it. Fails naming the first missing or bad part and the carry folder (device call) that brought it.
v34_verify() {
  local man="$V34_DIR/V34_MANIFEST" kind sum size a b p got wheel="" want=""
  local -a parts=()
  [ -f "$man" ] || { echo "[v34] no $man: the first call (.v34_01) did not run on this machine" >&2; return 1; }
  mkdir -p "$V34_DIR/wheels"
  while read -r kind sum size a b; do
    if [ "$kind" = part ]; then  # a = folder, b = part name
      p="$V34_DIR/$b"
      if [ ! -f "$p" ]; then
        echo "[v34] MISSING PART $b (carried by $a): run that call again, on this machine" >&2; return 1
      fi
      got=$(stat -c %s "$p")
      if [ "$got" != "$size" ]; then
        echo "[v34] BAD PART $b (carried by $a): $got bytes, manifest $size" >&2; return 1
      fi
      got=$(sha256sum "$p" | cut -d' ' -f1)
      if [ "$got" != "$sum" ]; then
        echo "[v34] BAD PART $b (carried by $a): sha256 $got, manifest $sum" >&2; return 1
      fi
      parts+=("$p")
      continue
    fi
    # A 'file' line (or the end): the previous wheel's parts are all checked; rebuild and check it.
    if [ -n "$wheel" ]; then
      cat "${parts[@]}" >"$V34_DIR/wheels/$wheel"
      got=$(sha256sum "$V34_DIR/wheels/$wheel" | cut -d' ' -f1)
      if [ "$got" != "$want" ]; then
        echo "[v34] BAD WHEEL $wheel: reassembled sha256 $got, manifest $want" >&2; return 1
      fi
    fi
    wheel="$a" want="$sum" parts=()
  done < <(grep -v '^#' "$man"; echo end)
  echo "[v34] all $(grep -c '^part ' "$man") parts and $(grep -c '^file ' "$man") wheels match V34_MANIFEST"
}

v34_install() {
  rm -rf "$V34_SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$V34_SITE" \
    "$V34_DIR"/wheels/*.whl
  echo "[v34] installed $(find "$V34_DIR/wheels" -name '*.whl' | wc -l) wheels into $V34_SITE"
  v34_patch_warmup
}

# vLLM 0.34's kernel_warmup imports the MiniMax-M3 MSA warmup on every CUDA start-up, and its modules
# import CuTe DSL (`cutlass`, nvidia-cutlass-dsl, 188 MB, not carried): every engine died with
# "No module named 'cutlass'" (first run, 2026-12-03). Skip that MiniMax-only warmup when cutlass is
# absent; nothing else changes.
v34_patch_warmup() {
  python3 - "$V34_SITE/vllm/model_executor/warmup/kernel_warmup.py" <<'PY'
import sys
path = sys.argv[1]
src = open(path).read()
old = "    if current_platform.is_cuda():\n        # The MSA kernels"
new = ("    if current_platform.is_cuda() and __import__('importlib.util').util.find_spec('cutlass')"
       " is not None:\n        # The MSA kernels")
if new not in src:
    assert old in src, "vLLM's kernel_warmup changed: re-read it before patching"
    open(path, "w").write(src.replace(old, new))
print("[v34] kernel_warmup: MiniMax-M3 MSA warmup skipped without cutlass")
PY
}

# Proof: the versions, CUDA, a bf16 matmul on the GPU checked against fp32, a Triton kernel (Triton 3.8
# and its ptxas on this driver), NCCL's version (2.30.7, not the image's), vLLM's version, and vLLM's
# DSpark speculator module. Then every requirement of a carried package that the environment does not
# meet, and the image's versions of the packages whose presence or version was inferred, not read.
# The proof runs from a file, not python3 -c: Triton's @jit reads its kernel's source with inspect.
v34_prove() {
  mkdir -p "$V34_DIR"
  cat >"$V34_DIR/prove.py" <<'PY'
import os, sys, importlib.metadata as md
import torch
site = sys.argv[1]
assert torch.__file__.startswith(site), f"torch came from {torch.__file__}, not {site}"
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
assert torch.__version__.startswith("2.14.0") and torch.cuda.is_available()
print("device", torch.cuda.get_device_name(0), "nccl", torch.cuda.nccl.version(),
      "cudnn", torch.backends.cudnn.version())
g = torch.Generator(device="cuda").manual_seed(0)
a = torch.randn(4096, 4096, device="cuda", generator=g)
b = torch.randn(4096, 4096, device="cuda", generator=g)
c = (a.bfloat16() @ b.bfloat16()).float()
ref = a @ b
err = ((c - ref).norm() / ref.norm()).item()
print(f"bf16 matmul 4096^3 on GPU: relative error {err:.2e} vs fp32")
assert err < 1e-2, err
import triton, triton.language as tl
@triton.jit
def _add(x, y, o, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)
x = torch.arange(1000, device="cuda", dtype=torch.float32); o = torch.empty_like(x)
_add[(4,)](x, x, o, 1000, BLOCK=256)
assert torch.equal(o, 2 * x)
print("triton", triton.__version__, "kernel ok")
import flashinfer
print("flashinfer", flashinfer.__version__)
import vllm
print("vllm", vllm.__version__, "from", os.path.dirname(vllm.__file__))
assert vllm.__version__.startswith("0.34.0"), vllm.__version__
from vllm.vllm_flash_attn.flash_attn_interface import FA3_AVAILABLE, FA3_UNAVAILABLE_REASON
print("FA3 available", FA3_AVAILABLE, FA3_UNAVAILABLE_REASON or "")
from vllm.v1.worker.gpu.spec_decode.dspark import speculator as dspark_speculator
print("DSpark speculator:", dspark_speculator.DSparkSpeculator.__module__, dspark_speculator.DSparkSpeculator.__name__)
import transformers, huggingface_hub
print("transformers", transformers.__version__, "huggingface_hub", huggingface_hub.__version__)
# Requirements of what was carried that the environment (carried first, then the image) does not meet.
from packaging.requirements import Requirement
env = {"extra": ""}
seen, unmet = {}, []
for d in md.distributions(path=[site]):
    for r in d.requires or []:
        req = Requirement(r)
        if req.marker and not req.marker.evaluate(env):
            continue
        try:
            v = md.version(req.name)
        except md.PackageNotFoundError:
            unmet.append(f"{d.metadata['Name']} needs {req} (absent)"); continue
        if req.specifier and not req.specifier.contains(v, prereleases=True):
            unmet.append(f"{d.metadata['Name']} needs {req} (have {v})")
print("unmet requirements of carried packages:", len(unmet))
for u in sorted(unmet):
    print("  ", u)
names = ["aiohttp", "multidict", "yarl", "click", "hf-xet", "numpy", "numba", "setuptools", "protobuf",
         "requests", "opencv-python-headless", "cuda-bindings", "nvidia-cudnn-cu13", "nvidia-cublas",
         "nvidia-cusparselt-cu13", "nvidia-nvshmem-cu13", "nvidia-cuda-runtime", "nvidia-nvjitlink",
         "torchaudio", "typer", "anyio", "jinja2"]
have = []
for n in names:
    try:
        have.append(f"{n} {md.version(n)}")
    except md.PackageNotFoundError:
        have.append(f"{n} absent")
print("image:", ", ".join(have))
PY
  PYTHONPATH="$V34_SITE${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 python3 "$V34_DIR/prove.py" "$V34_SITE"
}

v34_main() {
  set -euo pipefail
  case "${1:-}" in
    --verify-only)
      shift
      mkdir -p "$V34_DIR"
      local d
      for d in "$@"; do cp "$d"/* "$V34_DIR"/; done
      v34_verify ;;
    --prove)
      v34_prove ;;
    "")
      v34_verify
      v34_install
      v34_prove
      touch "$V34_SITE/.ready"
      echo "[v34] vLLM 0.34 ready in $V34_SITE: source lab/gpu/vllm034_install.sh && use_vllm034" ;;
    *)
      echo "usage: $0 [--verify-only [DIR...] | --prove]" >&2; return 2 ;;
  esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  v34_main "$@"
fi
