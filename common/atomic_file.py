"""Files written whole or not at all: a reader (another rank, a poll, a push) never meets half a
file, and a kill mid-write leaves the previous version in place.

The temp file sits beside its destination as `.NAME.tmp-PID` (same filesystem, so the final
rename is atomic; hidden, so `train.publish.push` never uploads it; the pattern the trainer's
leftover
sweeps match, `train.loop.state.CHECKPOINT_LEFTOVERS` and `train.loop.metrics`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temp_beside(path: str | os.PathLike) -> Path:
    """`.NAME.tmp-PID` in PATH's folder."""
    p = Path(path)
    return p.with_name(f".{p.name}.tmp-{os.getpid()}")


@contextmanager
def replaced_whole(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside PATH to write; on a clean exit it replaces PATH in one rename, on
    an exception it is removed and PATH is left as it was."""
    tmp = temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_whole(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write DATA (text as UTF-8) to PATH through `replaced_whole`; -> PATH."""
    with replaced_whole(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return Path(path)
