"""Code prompts in HumanEval's form from Python source trees: the part the standard library's
prompts (`train/data/pystdlib.py`) and installed packages' (`train/data/pypackages.py`) share.

Every public function, and every public method of a public class, that has a docstring becomes
a task written as HumanEval writes one (the signature, then the docstring indented in triple
quotes, a method inside its class's header) behind the same instruction
(`train.data.humaneval.code_task_row`). Only prompts: the target writes the answers
(`train.prepare.regenerate`). Files are read in a fixed order (a folder's files before its
subfolders,
each sorted), so the same tree gives the same rows.
"""

from __future__ import annotations

import ast
import copy
import os
import random
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from train.data.humaneval import code_task_row

MIN_DOC, MAX_DOC = 20, 1200  # characters of a cleaned docstring


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


@dataclass
class Harvest:
    """Rows gathered from one or more trees, a task text seen before skipped."""

    rows: list[dict] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    files: int = 0
    unreadable_files: int = 0
    duplicate_tasks: int = 0

    def add_tree(self, root: Path, id_prefix: str, skip_dirs: frozenset[str] = frozenset()) -> int:
        """Walk `root` (folders named in `skip_dirs`, or starting with `test` or `.`, left out);
        each task's id is `ID_PREFIX/PATH:NAME`. -> how many rows this tree added."""
        before = len(self.rows)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(
                d for d in dirnames if d not in skip_dirs and not d.startswith(("test", "."))
            )
            for name in sorted(f for f in filenames if f.endswith(".py")):
                path = Path(dirpath) / name
                try:
                    tree = ast.parse(path.read_text(encoding="utf-8"))
                except (SyntaxError, UnicodeDecodeError, ValueError):
                    self.unreadable_files += 1
                    continue
                self.files += 1
                rel = path.relative_to(root).as_posix()
                for qual, text in module_tasks(tree):
                    if text in self.seen:
                        self.duplicate_tasks += 1
                        continue
                    self.seen.add(text)
                    self.rows.append(code_task_row(f"{id_prefix}/{rel}:{qual}", text))
        return len(self.rows) - before

    def sample_last(self, added: int, keep: int, seed: int | str) -> int:
        """Keep a random `keep` (order kept, seeded) of the last `added` rows. -> rows dropped."""
        if added <= keep:
            return 0
        start = len(self.rows) - added
        chosen = sorted(random.Random(seed).sample(range(added), keep))
        self.rows[start:] = [self.rows[start + i] for i in chosen]
        return added - keep

    def finish(self, seed: int, max_rows: int | None) -> tuple[list[dict], dict]:
        """-> (rows shuffled with `seed`, at most `max_rows`; the counts for a report)."""
        rows = list(self.rows)
        random.Random(seed).shuffle(rows)
        rows = rows[:max_rows] if max_rows is not None else rows
        counts = {
            "files": self.files,
            "unreadable_files": self.unreadable_files,
            "duplicate_tasks": self.duplicate_tasks,
            "found": len(self.rows),
            "kept": len(rows),
            "seed": seed,
            "splits": {"train": len(rows)},
        }
        return rows, counts
