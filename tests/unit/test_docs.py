"""The README and docs/ say what to run, and what they name exists.

Pinned here, read from the text (nothing is imported or run):
- the README stays under 200 lines, and its set-up section holds exactly the two commands of a
  fresh machine, `bash scripts/quickstart.sh` and `bash scripts/test.sh`;
- every `python -m MODULE` (or `torchrun ... -m`, `accelerate launch ... -m`) in README.md and
  docs/*.md names a module file of this repository, found by `importlib`'s path finder inside the
  repo (a package needs a `__main__.py`); third-party modules only from `THIRD_PARTY`;
- every `+experiment=NAME` names a file in configs/experiment/, every relative link a file;
- docs/train.md documents every key of `train/schema.py`, and names no key it lacks;
- nothing points outside the repository (`../shared`) or at research material: no
  `docs/benchmarks` path, and `lab/` only as the README's layout entry, whose one link is
  `lab/README.md` (the lab's rules). The product docs never send a user into the lab.
"""

from __future__ import annotations

import dataclasses
import re
from importlib.machinery import PathFinder
from pathlib import Path

import pytest

from train.schema import DistillCfg

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETUP_COMMANDS = ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
# Modules the docs describe that other changes are adding; skipped only while absent.
NEW_MODULES = {"serve.evaluate", "serve.parity", "train.recipe"}
THIRD_PARTY = {"pytest"}
# Schema keys that are no user setting.
UNDOCUMENTED_KEYS = {"extra"}

MODULE_RE = re.compile(
    r"(?:python3?|torchrun|accelerate launch)\b[^\n`|]*?\s-m\s+([A-Za-z_][\w.]*[A-Za-z_0-9])"
)
EXPERIMENT_RE = re.compile(r"\+experiment=([a-z0-9_][\w-]*)")  # NAME: a placeholder
LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
LAB_PATH_RE = re.compile(r"(?<![\w./-])lab/[\w./-]*")


def doc_files() -> list[Path]:
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [README, *docs]


def fenced_lines(text: str) -> list[str]:
    """The non-empty lines inside ``` blocks of `text`."""
    out, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside and line.strip():
            out.append(line.strip())
    return out


def section(text: str, title: str) -> str:
    """The text under the level-2 heading `title`, up to the next level-2 heading."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"README has no '## {title}' section"
    return m.group(1)


def repo_module_file(name: str) -> Path | None:
    """The file `python -m name` runs, looked up only inside the repository, or None."""
    parts, search, spec = name.split("."), [str(ROOT)], None
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), search)
        if spec is None:
            return None
        if i < len(parts) - 1:
            if not spec.submodule_search_locations:
                return None
            search = list(spec.submodule_search_locations)
    if spec.submodule_search_locations:  # a package runs its __main__
        main = Path(list(spec.submodule_search_locations)[0]) / "__main__.py"
        return main if main.is_file() else None
    return Path(spec.origin) if spec.origin else None


def modules_named() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in doc_files():
        for name in MODULE_RE.findall(path.read_text()):
            found.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    return found


def schema_keys(cls=DistillCfg, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type) or (
            isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)
        ):
            keys += schema_keys(f.default_factory, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; keep it under 200"


def test_readme_setup_is_exactly_the_two_commands():
    setup = section(README.read_text(), "Set-up")
    assert fenced_lines(setup) == SETUP_COMMANDS
    for cmd in SETUP_COMMANDS:
        assert (ROOT / cmd.split()[-1]).is_file(), cmd


def test_the_module_finder_tells_modules_from_missing_ones():
    # Negative controls: the lookup must fail for names that are not runnable modules.
    assert repo_module_file("train.distill") == ROOT / "train" / "distill.py"
    assert repo_module_file("serve.api") == ROOT / "serve" / "api" / "__main__.py"
    assert repo_module_file("train.no_such_module") is None
    assert repo_module_file("train") is None  # a package without __main__.py
    assert repo_module_file("pytest") is None  # installed, but not in the repository


def test_every_module_named_in_the_docs_is_a_module_of_the_repo():
    named = modules_named()
    assert {"train.distill", "serve.launch", "serve.check"} <= set(named)  # the regex reads them
    missing = []
    for name, where in sorted(named.items()):
        if name in THIRD_PARTY or repo_module_file(name) is not None:
            continue
        if name in NEW_MODULES:
            continue  # added by another change; pinned once its file exists
        missing.append(f"python -m {name} ({', '.join(sorted(where))})")
    assert not missing, "no such module in the repository: " + "; ".join(missing)


def test_every_experiment_named_exists():
    missing = [
        f"+experiment={name} ({path.name})"
        for path in doc_files()
        for name in EXPERIMENT_RE.findall(path.read_text())
        if not (ROOT / "configs" / "experiment" / f"{name}.yaml").is_file()
    ]
    assert not missing, missing


def test_every_relative_link_resolves():
    broken = []
    for path in doc_files():
        for link in LINK_RE.findall(path.read_text()):
            if "://" in link:
                continue
            target = (path.parent / link).resolve()
            if not target.exists():
                broken.append(f"{path.name}: {link}")
    assert not broken, broken


def test_train_md_documents_every_schema_key():
    text = (ROOT / "docs" / "train.md").read_text()
    keys = [k for k in schema_keys() if k not in UNDOCUMENTED_KEYS]
    assert "trainer.max_steps" in keys and "data.regenerate.temperature" in keys
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"docs/train.md lacks {missing}"


def test_every_key_train_md_names_exists():
    # The other direction: a key renamed or removed in the schema must leave the page too.
    text = (ROOT / "docs" / "train.md").read_text()
    groups = "|".join(
        f.name
        for f in dataclasses.fields(DistillCfg)
        if f.default_factory is not dataclasses.MISSING
        and dataclasses.is_dataclass(f.default_factory)
    )
    named = set(re.findall(rf"`((?:{groups})\.[a-z_][\w.]*)`", text))
    assert "trainer.max_steps" in named
    unknown = sorted(named - set(schema_keys()))
    assert not unknown, f"docs/train.md names keys the schema lacks: {unknown}"


@pytest.mark.parametrize("needle", ["../shared", "docs/benchmarks"])
def test_nothing_points_outside_the_product(needle):
    hits = [p.name for p in doc_files() if needle in p.read_text()]
    assert not hits, f"{needle!r} in {hits}"


def test_lab_appears_only_as_the_readme_layout_entry():
    for path in doc_files()[1:]:
        assert not LAB_PATH_RE.findall(path.read_text()), f"{path.name} points into lab/"
    text = README.read_text()
    layout = section(text, "Layout")
    outside = text.replace(layout, "")
    assert not LAB_PATH_RE.findall(outside), "README names lab/ outside its layout section"
    assert sorted(LAB_PATH_RE.findall(layout)) == ["lab/", "lab/README.md", "lab/README.md"]
    assert layout.count("](lab/README.md)") == 1
