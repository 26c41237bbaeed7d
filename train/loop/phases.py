"""Optional timing marks inside the draft objective (draft forward, loss, teacher logits), for
benchmarks.

The code marks its parts with `with phase("name"):`. With no recorder installed (the default)
that is a no-op; `scripts/bench_train_scale.py` installs one that records CUDA events (or
synchronised timers on CPU) around the same code the trainer runs. Phases nest (the teacher
logits are inside the loss, and in the backward pass of a checkpointed loss)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

_recorder: Callable[[str], contextlib.AbstractContextManager] | None = None


def phase(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if _recorder is None else _recorder(name)


def set_recorder(recorder: Callable[[str], contextlib.AbstractContextManager] | None) -> None:
    """Install `recorder(name) -> context manager` (None: back to the no-op)."""
    global _recorder
    _recorder = recorder
