"""Code prompts in HumanEval's form from the running Python's standard library: train rows for code.

SmolLM2's realized T=0 acceptance on HumanEval (1.76) trails ShareGPT's (2.07): its drafts learn
from chat answers, where the answer seldom starts by copying a signature from the prompt and
then writes a function. HumanEval's own 164 prompts are held out, so these rows come from another
source of the same form: every public function, and every public method of a public class, that
has a docstring, in the standard library's modules (tests, demos and GUI packages left out),
written as HumanEval writes a task (the signature, then the docstring indented in triple
quotes, a method inside its class's header) behind the same instruction
(`train.data.humaneval.code_task_row`). Only prompts: the target writes the answers
(`train.regenerate`), as it does for ShareGPT's.

Row: `{"id": "pystdlib/PATH:NAME", "messages": [{"role": "user", "content": ...}]}`. The rows depend
on the Python that builds them (the report names its version); the same Python and seed give the
same rows in the same order.
"""

from __future__ import annotations

import ast
import copy
import os
import random
import sys
import sysconfig
import textwrap
from pathlib import Path

from train.data.humaneval import code_task_row

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
MIN_DOC, MAX_DOC = 20, 1200  # characters of a cleaned docstring


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """`def name(args) -> ret:` as written by ast.unparse (no decorators, one line)."""
    stub = copy.copy(node)
    stub.body, stub.decorator_list = [ast.Pass()], []
    return ast.unparse(stub).split("\n", 1)[0]


def task_text(node, doc: str, cls: str | None = None) -> str:
    """HumanEval's layout: signature, docstring in triple quotes, a final newline; a method
    indented inside `class CLS:`."""
    body = textwrap.indent(f'"""{doc}\n"""', "    ")
    text = f"{_signature(node)}\n{body}\n"
    return f"class {cls}:\n{textwrap.indent(text, '    ')}" if cls else text


def _usable(node) -> str | None:
    """The cleaned docstring of a public function worth a prompt, else None."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
        return None
    doc = ast.get_docstring(node)
    if not doc or not MIN_DOC <= len(doc) <= MAX_DOC or '"""' in doc or "\\" in doc:
        return None
    return doc


def module_tasks(tree: ast.Module) -> list[tuple[str, str]]:
    """(qualified name, task text) for a module's public functions and public classes' methods."""
    out = []
    for node in tree.body:
        if (doc := _usable(node)) is not None:
            out.append((node.name, task_text(node, doc)))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if (doc := _usable(item)) is not None:
                    out.append((f"{node.name}.{item.name}", task_text(item, doc, node.name)))
    return out


def pystdlib_rows(
    root: str | os.PathLike | None = None, seed: int = 0, max_rows: int | None = None
) -> tuple[list[dict], dict]:
    """-> (rows, report) for the standard library under `root` (default: this Python's), in a
    fixed order shuffled with `seed`, at most `max_rows`; a task text seen before is skipped."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise ValueError(f"{root}: no such folder (the Python standard library)")
    rows, seen = [], set()
    files = unreadable = duplicates = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and not d.startswith(("test", "."))
        )
        for name in sorted(f for f in filenames if f.endswith(".py")):
            path = Path(dirpath) / name
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                unreadable += 1
                continue
            files += 1
            rel = path.relative_to(root).as_posix()
            for qual, text in module_tasks(tree):
                if text in seen:
                    duplicates += 1
                    continue
                seen.add(text)
                rows.append(code_task_row(f"pystdlib/{rel}:{qual}", text))
    if not rows:
        raise ValueError(f"{root}: no documented public functions found")
    found = len(rows)
    random.Random(seed).shuffle(rows)
    rows = rows[:max_rows] if max_rows is not None else rows
    report = {
        "python": sys.version.split()[0],
        "root": str(root),
        "files": files,
        "unreadable_files": unreadable,
        "duplicate_tasks": duplicates,
        "found": found,
        "kept": len(rows),
        "seed": seed,
        "splits": {"train": len(rows)},
    }
    return rows, report
