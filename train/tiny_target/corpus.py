"""Deterministic text corpus for the tiny target, built from files every machine has.

Design choices:
- Code is the CPython standard library source (`sysconfig.get_paths()["stdlib"]`, `*.py`), minus
  test suites, vendored packages, generated codec tables and machine-specific files, so two machines
  with the same Python version read the same bytes.
- Prose is Python's own LICENSE, the pydoc topic texts (the language reference, shipped with every
  CPython as `pydoc_data.topics`) and `/usr/share/common-licenses` where that folder exists.
  Docstrings and comments inside the code are mined for prose later (`chat_data.py`).
- Selection is sorted, then shuffled with the seed, then capped; the held-out split is whole
  documents (never a slice of a training document), so held-out loss measures generalisation.
- `fingerprint()` hashes names and contents: it goes into the build recipe, so a different Python
  version (a different stdlib) triggers a rebuild instead of a silent mismatch.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Path parts that mark code we do not want: test suites (huge, repetitive), vendored third-party
# packages, demo scripts, and codec tables (walls of unicode literals, not Python style).
SKIP_PARTS = frozenset(
    {"site-packages", "test", "tests", "idle_test", "__pycache__", "turtledemo", "encodings"}
)
MAX_FILE_BYTES = 256 * 1024  # drops pydoc_data/topics.py (read as prose instead) and _pydecimal.py
COMMON_LICENSES = Path("/usr/share/common-licenses")
HELDOUT_FRACTION = 0.1


@dataclass(frozen=True)
class Doc:
    """One corpus document. `name` is stable across machines ("py:email/utils.py",
    "topic:assert", "license:GPL-3"); `kind` is "code" or "prose"."""

    name: str
    kind: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """Train and held-out documents; no document (file, topic, licence) is in both."""

    train: list[Doc]
    heldout: list[Doc]

    def fingerprint(self) -> str:
        """sha256 over (split, name, content) of every document, in order."""
        h = hashlib.sha256()
        for split, docs in (("train", self.train), ("heldout", self.heldout)):
            for d in docs:
                h.update(f"{split}\0{d.name}\0".encode())
                h.update(hashlib.sha256(d.text.encode()).digest())
        return h.hexdigest()

    def stats(self) -> dict:
        """Document and character counts per split and kind (for train_summary.json)."""
        out: dict = {}
        for split, docs in (("train", self.train), ("heldout", self.heldout)):
            for kind in ("code", "prose"):
                sel = [d for d in docs if d.kind == kind]
                out[f"{split}_{kind}_docs"] = len(sel)
                out[f"{split}_{kind}_chars"] = sum(len(d.text) for d in sel)
        return out


def _read_text(path: Path) -> str | None:
    """UTF-8 text of a regular file within the size cap, else None (binary or huge files)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.strip() and "\0" not in text else None


def stdlib_code_paths(stdlib: Path | None = None) -> list[tuple[str, Path]]:
    """(doc name, path) of the candidate standard-library `.py` files, sorted by name."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if SKIP_PARTS & set(rel.parts) or rel.name.startswith("_sysconfigdata"):
            continue  # _sysconfigdata holds this machine's build flags: not portable
        out.append((f"py:{rel.as_posix()}", path))
    return sorted(out)


def stdlib_code_docs(seed: int, max_docs: int | None, stdlib: Path | None = None) -> list[Doc]:
    """Seeded shuffle of the sorted candidates, read in that order until `max_docs` are readable
    (so a small cap reads a few files, not the whole stdlib)."""
    paths = stdlib_code_paths(stdlib)
    random.Random(seed).shuffle(paths)
    docs = []
    for name, path in paths:
        if max_docs is not None and len(docs) >= max_docs:
            break
        text = _read_text(path)
        if text is not None:
            docs.append(Doc(name, "code", text))
    return docs


def local_prose_docs(stdlib: Path | None = None) -> list[Doc]:
    """Prose docs: Python's LICENSE, pydoc topics, and common licences, sorted by name."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    docs = []
    lic = _read_text(root / "LICENSE.txt")
    if lic is not None:
        docs.append(Doc("license:python", "prose", lic))
    try:
        from pydoc_data.topics import topics  # shipped with CPython; absent in some distro splits
    except ImportError:
        topics = {}
    docs += [Doc(f"topic:{k}", "prose", v) for k, v in sorted(topics.items()) if v.strip()]
    if COMMON_LICENSES.is_dir():
        seen: set[Path] = set()  # GPL -> GPL-3 etc. are symlinks: keep each text once
        for path in sorted(COMMON_LICENSES.iterdir()):
            real = path.resolve()
            text = None if real in seen else _read_text(real)
            seen.add(real)
            if text is not None:
                docs.append(Doc(f"license:{path.name}", "prose", text))
    return sorted(docs, key=lambda d: d.name)


def _split(docs: list[Doc]) -> tuple[list[Doc], list[Doc]]:
    """(train, held-out): the held-out set is the first ~10% of the already shuffled docs."""
    if len(docs) < 2:
        raise ValueError(f"need at least 2 documents to split train/held-out, got {len(docs)}")
    n_held = max(1, round(HELDOUT_FRACTION * len(docs)))
    return docs[n_held:], docs[:n_held]


def build_corpus(seed: int, max_files: int | None = None, stdlib: Path | None = None) -> Corpus:
    """Select code and prose documents and split each kind into train / held-out.

    `max_files` caps the code files and, separately, the prose documents (so `--max-files 40`
    makes a fast test corpus). Same seed, cap and Python install -> same corpus.
    """
    code_train, code_held = _split(stdlib_code_docs(seed, max_files, stdlib))
    prose = local_prose_docs(stdlib)
    random.Random(seed + 1).shuffle(prose)
    prose_train, prose_held = _split(prose[:max_files] if max_files is not None else prose)
    return Corpus(train=code_train + prose_train, heldout=code_held + prose_held)
