"""When is a recipe stage done: `OUT/STAGE/done.json` and the fingerprints it holds.

A stage's key is sha256 of (its settings, the outputs it reads of earlier stages, its external
input files). Earlier stages are referred to by the `outputs` digest their own done.json records,
so a stage rerun that writes the same bytes keeps the later stages valid, and one that writes
other bytes (or a changed setting) makes every later stage run again.

- done.json (`write_done`): the key, the command, the settings, each output file's size and
  sha256, the versions (python, torch, transformers, vllm if installed), the seconds. A stage is
  done iff done.json exists, its key equals the key computed now, and every output it lists still
  has its size (and, for files up to `REHASH_BYTES`, its sha256: a hand-edited prompts file is
  caught; a 3 GB weights file is checked by size, its hash was taken once when it was written).
- started.json (`mark_started`): the key a stage started under. Rerunning a stage that did not
  finish continues its outputs (regenerate and distill resume) only if that key is the same;
  otherwise the stage folder is emptied first, so no output of other settings is continued.
Paths are recorded relative to OUT, so a folder moved to another machine stays valid.

Two things make a finished run move to another machine without its bulk:
- A stage's scratch (distill's `run/checkpoints/`, gigabytes of optimizer state kept only to
  continue an unfinished run) is neither recorded nor checked: a done stage stays done when it
  is deleted or left behind.
- Later stages' keys take an earlier stage's `identity`: its outputs digest, or what the stage
  names instead. A target rebuilt from a checksummed source is the same model on every machine,
  though incidental files differ (the parts' paths in prepare_summary.json, config.json's
  transformers version), so its identity is its key: rebuilt elsewhere, it keeps the answers and
  the draft made from it valid.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import shutil
import time
from pathlib import Path

from common.atomic_file import write_whole
from train.publish.package_files import sha256_file

DONE, STARTED = "done.json", "started.json"
REHASH_BYTES = 64 << 20


def stage_key(settings: dict, upstream: dict[str, str], files: list[Path]) -> str:
    """sha256 of the settings, the upstream stages' output digests and external files' hashes."""
    external = {str(p): sha256_file(p) if p.is_file() else None for p in files}
    blob = json.dumps([settings, upstream, external], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def output_records(folder: Path, scratch: tuple[str, ...] = ()) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under `folder` but the state files, hidden
    files and those under a `scratch` folder (relative to `folder`)."""
    out = {}
    skip = [Path(s).parts for s in scratch]
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or (p.parent == folder and p.name in (DONE, STARTED)):
            continue
        parts = p.relative_to(folder).parts
        if any(part.startswith(".") for part in parts) or any(parts[: len(s)] == s for s in skip):
            continue
        out[str(p.relative_to(folder))] = [p.stat().st_size, sha256_file(p)]
    return out


def outputs_digest(records: dict) -> str:
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


def identity(done: dict) -> str:
    """What later stages' keys take from a done stage (done.json written before identities
    existed: its outputs digest)."""
    return done.get("identity") or done["outputs_digest"]


def read_done(folder: Path) -> dict | None:
    try:
        return json.loads((folder / DONE).read_text())
    except (OSError, ValueError):
        return None


def is_done(folder: Path, key: str) -> tuple[bool, str]:
    """-> (done, why not)."""
    done = read_done(folder)
    if done is None:
        return False, "not run" if not (folder / STARTED).exists() else "unfinished"
    if done.get("key") != key:
        return False, "its inputs or settings changed"
    for rel, (size, sha) in done["outputs"].items():
        p = folder / rel
        if not p.is_file() or p.stat().st_size != size:
            return False, f"output {rel} is missing or has another size"
        if size <= REHASH_BYTES and sha256_file(p) != sha:
            return False, f"output {rel} changed"
    return True, ""


def prepare_folder(folder: Path, key: str) -> bool:
    """Before a stage runs: keep what an unfinished run of the same key left (-> True: it
    continues), else empty the folder. Then record the key in started.json."""
    started = None
    try:
        started = json.loads((folder / STARTED).read_text()).get("key")
    except (OSError, ValueError):
        pass
    resume = started == key and read_done(folder) is None
    if folder.exists() and not resume:
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_whole(folder / STARTED, json.dumps({"key": key, "time": time.time()}) + "\n")
    return resume and any(p.name != STARTED for p in folder.iterdir())


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "vllm", "gguf"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def write_done(
    folder: Path,
    key: str,
    settings: dict,
    commands: list,
    seconds: float,
    scratch: tuple[str, ...] = (),
    same_identity_as_key: bool = False,
) -> dict:
    """Record a finished stage. `scratch`: folders left out of its outputs; `same_identity_as_key`:
    later stages are keyed on this stage's key, not on its outputs' bytes."""
    records = output_records(folder, scratch)
    digest = outputs_digest(records)
    done = {
        "key": key,
        "commands": commands,
        "settings": settings,
        "versions": versions(),
        "seconds": round(seconds, 1),
        "outputs": records,
        "outputs_digest": digest,
        "scratch": list(scratch),
        "identity": key if same_identity_as_key else digest,
    }
    write_whole(folder / DONE, json.dumps(done, indent=2, default=str) + "\n")
    (folder / STARTED).unlink(missing_ok=True)
    return done
