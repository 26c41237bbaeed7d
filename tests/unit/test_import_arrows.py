"""The package import map, read from the source with `ast` (nothing is imported).

Arrows go one way: `scripts -> serve, train -> common`. `common` imports none of the others,
`train` and `serve` never import `scripts`, and `serve` never imports `train` (a server must not
pull in the trainer). There is no import circle between modules. Imports inside functions count:
a local import hides a circle from Python's import order, not from the design.

The lab (`lab/`: research pipelines, ablations, one-off analyses) may import the product, never
the reverse, and the product does not even name it: a clone without the lab, or a reader of the
product alone, finds no pointer into it, nor into the workspace beside a checkout (`../shared`)
or the research log's raw folders, which left the tree. That is read from the text of every
product code and config file; tests/unit/test_docs.py holds the README and docs/ to the same rule.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "train", "serve", "scripts", "lab")
# package -> packages it must never import
FORBIDDEN = {
    "common": {"train", "serve", "scripts", "lab"},
    "train": {"serve", "scripts", "lab"},
    "serve": {"train", "scripts", "lab"},
    "scripts": {"lab"},
    "lab": set(),
}
# The product's files, by path prefix, whose text must not point into the lab and the rest. The
# README and docs/ are held to the same rule by tests/unit/test_docs.py, which allows the README's
# one layout line that links lab/README.md.
PRODUCT = ("common/", "train/", "serve/", "configs/", "scripts/")
NOT_NAMED = re.compile(r"(?<![\w.-])lab/|\.\./shared|docs/benchmarks")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path, known: set[str]) -> set[str]:
    """Project modules that `path` imports (anywhere in the file), resolved to the deepest known
    module: `from a.b import c` is `a.b.c` when c is a module, else `a.b`."""
    me = module_name(path, root)
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" for a in node.names] + [prefix]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                out.add(name)
    return out


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    files = [p for pkg in packages for p in (root / pkg).rglob("*.py")]
    known = {module_name(p, root) for p in files}
    return {module_name(p, root): imported_modules(p, root, known) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [m0, m1, ..., m0], or None (iterative DFS, three colours)."""
    colour = dict.fromkeys(graph, 0)
    for start in sorted(graph):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif colour.get(child) == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def wrong_arrows(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        pkg = mod.split(".")[0]
        for dep in sorted(deps):
            if dep.split(".")[0] in FORBIDDEN[pkg]:
                bad.append(f"{mod} -> {dep}")
    return bad


def product_files(root: Path) -> list[str]:
    """Tracked product files (git's list, so build outputs and caches do not count)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *PRODUCT], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    return sorted(p for p in listed.split("\0") if p)


def forbidden_mentions(root: Path, files: list[str]) -> list[str]:
    """`FILE:LINE: TEXT` for every line that names the lab, ../shared or docs/benchmarks."""
    found = []
    for rel in files:
        try:
            text = (root / rel).read_text()
        except UnicodeDecodeError:  # a binary file (an image) quotes no path
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if NOT_NAMED.search(line):
                found.append(f"{rel}:{number}: {line.strip()[:100]}")
    return found


def test_no_import_circle():
    cycle = find_cycle(import_graph(ROOT))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_arrows_point_one_way():
    assert wrong_arrows(import_graph(ROOT)) == []


def test_product_names_neither_lab_nor_shared_nor_old_raw_folders():
    found = forbidden_mentions(ROOT, product_files(ROOT))
    assert found == [], "product files pointing out of the product:\n" + "\n".join(found)


def test_mention_check_catches_each_pointer_and_spares_lookalikes(tmp_path):
    files = {
        "train/a.py": "# see lab/gpu/run_all.sh\n",
        "configs/b.yaml": "# x: ../shared/docs/dspark.md\n",
        "scripts/c.sh": "# numbers in docs/benchmarks.md\n",
        "serve/d.py": "# fine: `docs/results.md`, collab/x, my_lab/y, a.lab/z\n",
        "common/e.py": "# see lab/LOG.md\n",
        "README.md": "lab/ is linked from the layout (test_docs.py's rule)\n",
        "lab/README.md": "lab/ is the lab\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert product_files(tmp_path) == [
        "common/e.py",
        "configs/b.yaml",
        "scripts/c.sh",
        "serve/d.py",
        "train/a.py",
    ]
    found = forbidden_mentions(tmp_path, product_files(tmp_path))
    assert [f.split(":")[0] for f in found] == [
        "common/e.py",
        "configs/b.yaml",
        "scripts/c.sh",
        "train/a.py",
    ]


@pytest.fixture
def toy_repo(tmp_path):
    """A repo with a circle (common.a <-> common.b, one side inside a function) and three wrong
    arrows (common -> train, relative; serve -> train; scripts -> lab) beside a right one
    (lab -> train): the checks must see the circle and the wrong arrows alone."""
    files = {
        "common/__init__.py": "",
        "common/a.py": "from common.b import X\n",
        "common/b.py": "X = 1\ndef f():\n    from common import a\n",
        "common/c.py": "from ..train import loop\n",
        "train/__init__.py": "",
        "train/loop.py": "import common.b\n",
        "serve/__init__.py": "",
        "serve/run.py": "from train.loop import *\n",
        "scripts/__init__.py": "",
        "scripts/run.py": "from lab.gpu import carry\n",
        "lab/__init__.py": "",
        "lab/gpu/__init__.py": "",
        "lab/gpu/carry.py": "import train.loop\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_checks_catch_a_planted_circle_and_wrong_arrows(toy_repo):
    graph = import_graph(toy_repo)
    assert graph["common.c"] == {"train", "train.loop"}  # relative import resolved
    assert find_cycle(graph) == ["common.a", "common.b", "common.a"]
    assert wrong_arrows(graph) == [
        "common.c -> train",
        "common.c -> train.loop",
        "scripts.run -> lab.gpu",
        "scripts.run -> lab.gpu.carry",
        "serve.run -> train.loop",
    ]
