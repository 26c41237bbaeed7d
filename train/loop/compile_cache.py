"""torch.compile's artifacts carried from one run to the next (`trainer.compile_cache=PATH`).

A run loads PATH before it compiles anything, so the graphs and kernels an earlier run compiled
(same code, shapes, torch and GPU) come from the file instead of being compiled again, and at its
end it writes everything it compiled or loaded back to PATH (atomically). For machines that start
empty every time, as the H200 sessions do: there the first evaluation of a SmolLM2 distill stage,
where the compiles happen, took about 68 s against about 2 s for a later one. Entries that do not
fit this run (another torch, GPU or code) are misses and cost nothing; a file that cannot be read is
reported and the run compiles as usual.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from common.atomic_file import write_whole


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _count(info) -> int:
    return sum(len(v) for v in info.artifacts.values()) if info is not None else 0


def load_compile_cache(path: str | os.PathLike) -> str:
    """Load PATH's artifacts into torch's compile caches; -> a line saying what happened."""
    p = Path(path)
    if not p.is_file():
        return f"[distill] compile cache {p}: none yet; this run writes it at its end"
    data = p.read_bytes()
    try:  # torch logs what it cannot read and returns None
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as e:  # another torch's format, a cut file: compile as usual
        info, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "torch could not read it: see its warning above"
    if _count(info) == 0:
        return f"[distill] compile cache {p} not loaded ({why}); compiling afresh"
    return f"[distill] compile cache {p}: {_count(info)} artifacts loaded ({_mib(len(data))})"


def save_compile_cache(path: str | os.PathLike) -> str:
    """Write what this process compiled or loaded to PATH; -> a line saying what was written."""
    p = Path(path)
    try:  # after the run: a failure here must not cost its result
        out = torch.compiler.save_cache_artifacts()
        if out is None or _count(out[1]) == 0:
            return f"[distill] compile cache {p}: nothing compiled, not written"
        data, info = out
        p.parent.mkdir(parents=True, exist_ok=True)
        write_whole(p, data)  # a reader never sees half a file
    except Exception as e:
        return f"[distill] compile cache {p} not written ({type(e).__name__}: {e})"
    return f"[distill] compile cache {p}: {_count(info)} artifacts written ({_mib(len(data))})"
