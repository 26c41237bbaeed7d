"""Build recipe, provenance and atomic publishing of the tiny-target folder.

Contract: `OUT/recipe.json` holds {"recipe": {...}, "recipe_hash": sha256 of the canonical recipe
JSON, "provenance": {...}}. The recipe is everything that decides the bytes of the build (settings,
preset, corpus fingerprint, device type and dtype); provenance is what helps a human (command,
git SHA, package versions, output hashes) and never affects reuse, so a package upgrade does not
force a rebuild.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from train.publish.package_files import sha256_file

RECIPE_VERSION = 2  # bump when the builder changes what a recipe produces
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "data/train.jsonl")


def recipe_hash(recipe: dict) -> str:
    """sha256 of the recipe as canonical JSON (sorted keys, no whitespace)."""
    blob = json.dumps(recipe, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def reusable(out: Path, want_hash: str) -> bool:
    """True if `out` is a finished build (all REQUIRED_FILES) recorded with `want_hash`."""
    try:
        recorded = json.loads((out / "recipe.json").read_text())["recipe_hash"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return recorded == want_hash and all((out / f).is_file() for f in REQUIRED_FILES)


def provenance(folder: Path) -> dict:
    """Command, git SHA, versions, and hashes of the outputs already written in `folder`."""
    import tokenizers
    import torch
    import transformers

    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    outputs = ("model.safetensors", "tokenizer.json", "data/train.jsonl", "data/heldout.jsonl")
    return {
        "command": [sys.executable, *sys.argv],
        "git_sha": sha or None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "sha256": {f: sha256_file(folder / f) for f in outputs if (folder / f).is_file()},
    }


def temp_dir_for(out: Path) -> Path:
    """A fresh sibling `OUT.tmp-<pid>-<rand>` (same filesystem, so the final rename is atomic)."""
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    return tmp


def publish(tmp: Path, out: Path, want_hash: str) -> bool:
    """Move the finished `tmp` build to `out`. Returns False (and drops `tmp`) if a concurrent
    builder published the same recipe first.

    An existing `out` (stale recipe, or --force) is renamed aside first and deleted after the
    swap, so readers see the old folder or the new one, never a half-written one.
    """
    old = None
    if out.exists():
        old = out.with_name(f"{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        out.rename(old)
    try:
        tmp.rename(out)
    except OSError:  # `out` reappeared: another process published between our two renames
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        if reusable(out, want_hash):
            return False
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return True
