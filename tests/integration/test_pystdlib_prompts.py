"""train/data/pystdlib.py: HumanEval-form code prompts from a standard library's documented public
functions and methods; `python -m train.prepare.data pystdlib` writes them as a train split."""

import ast
import gzip
import json

import pytest

from train.data.humaneval import INSTRUCTION
from train.data.pystdlib import pystdlib_rows
from train.prepare.data import main

MODULE = '''
import functools


@functools.cache
def area(width: float, height: float = 1.0) -> float:
    """Return the area of a width by height rectangle.

    >>> area(2, 3)
    6
    """
    return width * height


def _private(x):
    """A private helper that is never a prompt."""


def short(x):
    """Too short."""


def escaped(x):
    """A docstring with a backslash \\\\n in it is left out."""


async def fetch(url):
    """Fetch the url and return its body as bytes."""


class Stack:
    def push(self, item):
        """Put item on the top of the stack."""

    def _grow(self):
        """A private method that is never a prompt."""


class _Hidden:
    def shown(self):
        """A method of a private class is never a prompt."""
'''


@pytest.fixture
def stdlib(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "shapes.py").write_text(MODULE)
    (root / "pkg" / "copy_of_shapes.py").write_text(MODULE)  # the same tasks again
    (root / "test").mkdir()
    (root / "test" / "test_shapes.py").write_text('def test_area():\n    """Checks area."""\n')
    (root / "idlelib").mkdir()
    (root / "idlelib" / "gui.py").write_text('def window():\n    """Opens a window here."""\n')
    (root / "broken.py").write_text("def (:\n")
    return root


def test_public_documented_functions_and_methods_become_humaneval_prompts(stdlib):
    rows, report = pystdlib_rows(stdlib)
    by_id = {r["id"]: r["messages"][0]["content"] for r in rows}
    assert sorted(by_id) == [
        "pystdlib/shapes.py:Stack.push",
        "pystdlib/shapes.py:area",
        "pystdlib/shapes.py:fetch",
    ]  # a folder's own files come before its subfolders: pkg/ only repeats them
    area = by_id["pystdlib/shapes.py:area"]
    assert area == INSTRUCTION + (
        "def area(width: float, height: float=1.0) -> float:\n"
        '    """Return the area of a width by height rectangle.\n'
        "\n"
        "    >>> area(2, 3)\n"
        "    6\n"
        '    """\n'
    )
    assert by_id["pystdlib/shapes.py:Stack.push"] == INSTRUCTION + (
        "class Stack:\n"
        "    def push(self, item):\n"
        '        """Put item on the top of the stack.\n'
        '        """\n'
    )
    assert by_id["pystdlib/shapes.py:fetch"].startswith(INSTRUCTION + "async def fetch")
    for text in by_id.values():  # each task parses as Python
        ast.parse(text[len(INSTRUCTION) :])
    assert report["files"] == 2 and report["unreadable_files"] == 1
    assert report["duplicate_tasks"] == 3 and report["found"] == report["kept"] == 3


def test_the_same_seed_gives_the_same_order_and_max_rows_cuts(stdlib):
    a, _ = pystdlib_rows(stdlib, seed=3)
    assert a == pystdlib_rows(stdlib, seed=3)[0]
    cut, report = pystdlib_rows(stdlib, seed=3, max_rows=2)
    assert cut == a[:2] and report["kept"] == 2 and report["found"] == 3


def test_no_library_or_no_functions_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        pystdlib_rows(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no documented public functions"):
        pystdlib_rows(tmp_path / "empty")


def test_prepare_data_writes_this_pythons_library_as_a_train_split(tmp_path, capsys):
    assert main(["pystdlib", "--out", str(tmp_path), "--gzip", "--max-rows", "50"]) == 0
    with gzip.open(tmp_path / "pystdlib-train.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 50 and all(r["id"].startswith("pystdlib/") for r in rows)
    report = json.loads((tmp_path / "pystdlib-report.json").read_text())
    assert report["kept"] == 50 and report["found"] > 1000  # CPython's library holds thousands
    with pytest.raises(SystemExit):
        main(["pystdlib", "--out", str(tmp_path), "--turns", "first"])
    with pytest.raises(SystemExit):
        main(["humaneval", "--out", str(tmp_path), "--max-rows", "3"])
