"""vLLM 0.34.0's own code, executed on CPU, as an oracle (no tests here).

`scripts/fetch_vllm_oracle.sh` unzips the few source files we execute from the 0.34.0 wheel into
`.vllm_oracle/` (ignored) and installs Triton next to them; Triton's interpreter
(TRITON_INTERPRET=1) runs vLLM's kernels on CPU tensors. A module is exec'd with only the imports
its code needs replaced: stand-ins for vLLM's logger, TP group and GPU helpers (which the
functions under test never call), real Triton for `vllm.triton_utils`. Nothing is copied.
Call `load(name)`; it raises `pytest.skip` when the files are absent.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("VLLM_ORACLE_DIR", Path(__file__).resolve().parents[1] / ".vllm_oracle"))
SPEC_DECODE = "vllm/v1/worker/gpu/spec_decode"
_cache: dict[str, dict] = {}


class _Unused:
    """Stand-in for a vLLM object the exec'd module imports but the oracle never uses."""

    def __init__(self, name: str = "unused"):
        self._name = name

    def __getattr__(self, key):
        return _Unused(f"{self._name}.{key}")

    def __call__(self, *args, **kwargs):
        return _Unused(f"{self._name}()")


def _triton():
    if not (ROOT / "triton" / "triton").is_dir():
        pytest.skip(f"no Triton in {ROOT}: run scripts/fetch_vllm_oracle.sh")
    os.environ["TRITON_INTERPRET"] = "1"
    if str(ROOT / "triton") not in sys.path:
        sys.path.insert(0, str(ROOT / "triton"))
    import triton
    import triton.language as tl

    return triton, tl


def _stub_modules(triton, tl) -> dict[str, types.ModuleType]:
    names = {
        "vllm": {},
        "vllm.envs": {},
        "vllm.config": {"VllmConfig": _Unused()},
        "vllm.config.compilation": {"CUDAGraphMode": _Unused()},
        "vllm.distributed.parallel_state": {"get_tp_group": _Unused()},
        "vllm.logger": {"init_logger": lambda name: _Unused(name)},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext},
        "vllm.utils.torch_utils": {"async_tensor_h2d": _Unused()},
        "vllm.v1.attention.backend": {"AttentionCGSupport": _Unused()},
        "vllm.v1.utils": {"CpuGpuBuffer": _Unused()},
        "vllm.v1.worker.gpu.async_utils": {
            "StepTimingSample": _Unused(),
            "new_d2h_stream": _Unused(),
            "stream": _Unused(),
        },
        "vllm.v1.worker.gpu.attn_utils": {
            "get_query_lens_mismatch_unsupported_backend": _Unused(),
            "get_varlen_cudagraph_unsupported_backend": _Unused(),
        },
    }
    mods = {}
    for name, attrs in names.items():
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        mods[name] = m
    mods["vllm"].envs = mods["vllm.envs"]
    return mods


def load(name: str) -> dict:
    """Namespace of `vllm/v1/worker/gpu/spec_decode/<name>.py` from the 0.34.0 wheel, exec'd."""
    if name in _cache:
        return _cache[name]
    path = ROOT / "src" / SPEC_DECODE / f"{name}.py"
    if not path.is_file():
        pytest.skip(f"{path} missing: run scripts/fetch_vllm_oracle.sh")
    triton, tl = _triton()
    saved = {k: sys.modules.get(k) for k in _stub_modules(triton, tl)}
    sys.modules.update(_stub_modules(triton, tl))
    try:
        ns = {"__name__": f"vllm_oracle.{name}", "__file__": str(path)}
        exec(compile(path.read_text(), str(path), "exec"), ns)
    finally:  # the stand-ins must not leak into other tests' imports
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    _cache[name] = ns
    return ns
