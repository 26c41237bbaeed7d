"""Optional wall-clock split of a training step into named phases (target forward, draft
forward, loss, teacher logits, backward, optimizer), for benchmarks.

The training code marks its parts with `with phase("name"):`. With no recorder installed (the
default) that is a no-op; `scripts/bench_train.py` installs one that records CUDA events (or
synchronised timers on CPU) around the same code the trainer runs. Phases may nest (the teacher
logits are inside the loss), so their times do not add up to the step."""

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
