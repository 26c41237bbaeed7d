"""vLLM compatibility suite: our checkpoints and pipeline against vLLM's own code.

Runs only in the separate vLLM venv (`scripts/test_vllm.sh`, marker `vllm`). In the main env,
where vLLM is absent, nothing here is even collected, so the default test run stays fast and never
imports vLLM. The vLLM version under test is printed in the pytest header and again at the end.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM:
    collect_ignore_glob = ["test_*.py"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _vllm_versions() -> str:
    from importlib import metadata

    import torch
    import transformers
    import vllm

    dist = next((d for d in ("vllm-cpu", "vllm") if _has_dist(d)), "vllm")
    return (
        f"vLLM under test: {vllm.__version__} (dist {dist} {metadata.version(dist)}), "
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )


def _has_dist(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def pytest_configure(config):
    # Emitted by vLLM's own imports (torch.jit.script_method in its kernels), not by our code.
    config.addinivalue_line(
        "filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
    )


def pytest_report_header(config):
    if HAVE_VLLM:
        return _vllm_versions()
    return None


def pytest_terminal_summary(terminalreporter):
    if HAVE_VLLM and any(str(p).endswith("vllm") for p in terminalreporter.config.args):
        terminalreporter.write_line(_vllm_versions())


@pytest.fixture(scope="session")
def vllm_workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm")
