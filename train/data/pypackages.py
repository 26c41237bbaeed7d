"""Code prompts in HumanEval's form from installed Python packages: more train rows for code.

The pinned SmolLM2 draft's HumanEval rounds end, four times in ten, on tokens the target gives at
least 0.8: the draft lacks code, not the target certainty. The standard library gives 3,630 prompts
(`train/data/pystdlib.py`); the packages named here give more of the same form
(`train/data/pycode.py`): each package's documented public functions and methods, tests left
out. Only prompts: the target writes the answers (`train.prepare.regenerate`).

Row: `{"id": "pypackages/PACKAGE/PATH:NAME", "messages": [...]}`. The rows depend on the installed
versions (the report names each, with its count); the same versions and seed give the same rows
in the same order. Packages are read in the order given; a task text seen in an earlier one is
skipped.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from train.data.pycode import Harvest

# Pure-Python libraries whose code reads like general programming (algorithms, text, data,
# files), most of them installed beside this repo's own requirements.
DEFAULT_PACKAGES = (
    "networkx",
    "sympy",
    "mpmath",
    "numpy",
    "pandas",
    "scipy",
    "jinja2",
    "click",
    "rich",
    "requests",
    "docutils",
    "setuptools",
)
SKIP_DIRS = frozenset({"__pycache__", "_vendor", "vendor", "benchmarks", "examples"})


def package_root(name: str) -> Path:
    """The folder an importable package lives in (found without importing it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{name}: not an installed package (pip install it, or leave it out)")
    return Path(next(iter(spec.submodule_search_locations)))


def package_version(name: str) -> str | None:
    """The installed distribution's version, where the import name is its distribution's."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


PER_PACKAGE = 1500  # at most this many rows a package, so one large library does not set the style


def pypackages_rows(
    packages: tuple[str, ...] | list[str] = DEFAULT_PACKAGES,
    seed: int = 0,
    max_rows: int | None = None,
    per_package: int | None = PER_PACKAGE,
) -> tuple[list[dict], dict]:
    """-> (rows, report) from `packages`: from each at most `per_package` (a seeded sample), all
    shuffled with `seed`, at most `max_rows`. A package not installed is an error naming it; one
    with no documented public function too."""
    if not packages:
        raise ValueError("no packages named")
    if per_package is not None and per_package < 1:
        raise ValueError(f"per_package must be at least 1, got {per_package}")
    roots = {name: package_root(name) for name in packages}  # every name checked before reading
    harvest, report = Harvest(), {}
    for name, root in roots.items():
        found = harvest.add_tree(root, f"pypackages/{name}", SKIP_DIRS)
        dropped = harvest.sample_last(found, per_package or found, f"{seed}/{name}")
        report[name] = {"version": package_version(name), "found": found, "kept": found - dropped}
    empty = [n for n, p in report.items() if not p["found"]]
    if empty:
        raise ValueError(f"{empty}: no documented public functions found (leave them out)")
    capped = len(harvest.rows)
    rows, counts = harvest.finish(seed, max_rows)
    found = sum(p["found"] for p in report.values())
    return rows, {
        "packages": report,
        "per_package": per_package,
        **counts,
        "found": found,
        "after_per_package": capped,
    }
