"""Code prompts in HumanEval's form from the running Python's standard library: train rows for code.

SmolLM2's realized T=0 acceptance on HumanEval (1.76) trails ShareGPT's (2.07): its drafts learn
from chat answers, where the answer seldom starts by copying a signature from the prompt and
then writes a function. HumanEval's own 164 prompts are held out, so these rows come from another
source of the same form: every public function, and every public method of a public class, that
has a docstring, in the standard library's modules (tests, demos and GUI packages left out),
written as HumanEval writes a task (`train/data/pycode.py`, shared with the installed packages'
prompts of `train/data/pypackages.py`). Only prompts: the target writes the answers
(`train.prepare.regenerate`), as it does for ShareGPT's.

Row: `{"id": "pystdlib/PATH:NAME", "messages": [{"role": "user", "content": ...}]}`. The rows depend
on the Python that builds them (the report names its version); the same Python and seed give the
same rows in the same order.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from train.data.pycode import Harvest

SKIP_DIRS = frozenset(
    {
        "__pycache__",
        "ensurepip",
        "idlelib",
        "lib2to3",
        "pydoc_data",
        "site-packages",
        "dist-packages",
        "tkinter",
        "turtledemo",
    }
)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def pystdlib_rows(
    root: str | os.PathLike | None = None, seed: int = 0, max_rows: int | None = None
) -> tuple[list[dict], dict]:
    """-> (rows, report) for the standard library under `root` (default: this Python's), in a
    fixed order shuffled with `seed`, at most `max_rows`; a task text seen before is skipped."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise ValueError(f"{root}: no such folder (the Python standard library)")
    harvest = Harvest()
    if not harvest.add_tree(root, "pystdlib", SKIP_DIRS):
        raise ValueError(f"{root}: no documented public functions found")
    rows, counts = harvest.finish(seed, max_rows)
    return rows, {"python": sys.version.split()[0], "root": str(root), **counts}
