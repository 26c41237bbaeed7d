#!/usr/bin/env python3
"""A device session's carries as calls of equal size, and their files joined back on the device.

A device call carries the working tree (tracked files and untracked ones git does not ignore)
plus at most 64 MiB in all. A session needs about 320 MB more (wheels, rows, the GGUF, vLLM).
Folders of fixed size (.gg1 with half the GGUF, vLLM's .c1-.c4) left 3-5 MB of room once the
tree had grown to 12 MB (2026-12-05), and the tree grows about 1 MB a session. `pack` cuts the
files, in the order given, into folders .k1, .k2, ... that each leave `--margin-mib` free
beside today's tree (a file may span two calls); `join`, on the device, puts each file back
together once all its pieces came, checks its sha256 and renames it into place whole.

    python3 lab/gpu/carry_pieces.py pack [--margin-mib 12] DEST=PATH ...
    python3 lab/gpu/carry_pieces.py pack --pipeline NAME     (its stage file's `#pack` lines)
    python3 lab/gpu/carry_pieces.py join .kN         (session.sh: each carried .kN)
    python3 lab/gpu/carry_pieces.py complete DEST    (exit 0 once all of DEST's files are in)

DEST: `carry` (the device's /tmp/carry, $CARRY_DIR), `vx` (/tmp/vx, $VX_DIR, vLLM's parts), or
one of them with a subfolder (`carry/.whl`), which appears only once all its files are in, so
lab/gpu/env.sh never installs half of the wheels. PATH: a file or a folder (its files).
Pieces wait in $PIECES_DIR (/tmp/carry-pieces) until their file is whole. Every .kN holds the
manifest (carry.json): the pieces of another pack are refused, not mixed in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab.gpu.check_carries import LIMIT, tree_bytes  # noqa: E402
from train.publish.package_files import sha256_file  # noqa: E402

MANIFEST = "carry.json"
ROOTS = {"carry": ("CARRY_DIR", "/tmp/carry"), "vx": ("VX_DIR", "/tmp/vx")}
SLACK = 256 * 1024  # the manifest and file-system rounding
BUF = 8 * 1024 * 1024


class CarryError(Exception):
    """Bad input to `pack`, or a carried folder that does not belong with what came before."""


# ---------------------------------------------------------------------------------- pack side
def parse_dest(dest: str) -> tuple[str, str | None]:
    """`root[/sub]` -> (root, sub or None)."""
    root, _, sub = dest.partition("/")
    if root not in ROOTS or "/" in sub or sub in (".", ".."):
        raise CarryError(f"DEST {dest!r}: one of {sorted(ROOTS)}, optionally /SUBFOLDER")
    return root, sub or None


def gather(specs: list[str], repo: Path) -> list[dict]:
    """DEST=PATH arguments (a relative PATH from `repo`) -> [{dest, name, src}] in order (a
    folder: its files, sorted)."""
    files, seen = [], {}
    for spec in specs:
        dest, sep, path = spec.partition("=")
        if not sep or not path:
            raise CarryError(f"{spec!r}: expected DEST=PATH")
        parse_dest(dest)
        src = repo / path  # an absolute path stays as it is
        if src.is_dir():
            entries = sorted(src.iterdir())
            nested = [e.name for e in entries if not e.is_file()]
            if nested:
                raise CarryError(f"{src} holds {nested}: only files are carried")
            if not entries:
                raise CarryError(f"{src} is empty")
        elif src.is_file():
            entries = [src]
        else:
            raise CarryError(f"{src}: no such file or folder (run its prepare script first)")
        for e in entries:
            key = (dest, e.name)
            if key in seen:
                raise CarryError(f"{e} and {seen[key]} both go to {dest}/{e.name}")
            seen[key] = e
            files.append({"dest": dest, "name": e.name, "src": e})
    return files


def plan(files: list[dict], cap: int) -> list[dict]:
    """Each file's pieces: the files in order, filling call 1 up to `cap` bytes, then call 2, ...
    (a file that does not fit the rest of a call goes on in the next)."""
    if cap <= 0:
        raise CarryError(f"no room in a call: {cap:,} bytes for carries")
    call, used = 1, 0
    for i, f in enumerate(files):
        f["size"] = f["src"].stat().st_size
        f["pieces"], offset = [], 0
        while offset < f["size"] or not f["pieces"]:
            if used == cap:
                call, used = call + 1, 0
            n = min(cap - used, f["size"] - offset)
            f["pieces"].append({"call": call, "piece": f"{i:03d}.{len(f['pieces'])}", "size": n})
            offset, used = offset + n, used + n
    return files


def copy_range(src: Path, dst: Path, offset: int, size: int) -> None:
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fi.seek(offset)
        while size:
            block = fi.read(min(BUF, size))
            fo.write(block)
            size -= len(block)


def pack(
    specs: list[str], repo: Path, margin: int, tree: int | None = None, limit: int = LIMIT
) -> list[str]:
    """Write .k1 .. .kN under `repo` (earlier .kN folders removed) -> the lines it prints."""
    tree = tree_bytes(repo) if tree is None else tree
    cap = limit - tree - margin - SLACK
    files = plan(gather(specs, repo), cap)
    for f in files:
        f["sha256"] = sha256_file(f["src"])
    calls = max(p["call"] for f in files for p in f["pieces"])
    entries = [{k: f[k] for k in ("dest", "name", "size", "sha256", "pieces")} for f in files]
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:16]
    manifest = {"pack": digest, "calls": calls, "files": entries}
    for old in repo.glob(".k[0-9]*"):
        if (old / MANIFEST).is_file():
            shutil.rmtree(old)
    folders = [repo / f".k{c}" for c in range(1, calls + 1)]
    for d in folders:
        d.mkdir()
        (d / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for f in files:
        offset = 0
        for p in f["pieces"]:
            copy_range(f["src"], folders[p["call"] - 1] / p["piece"], offset, p["size"])
            offset += p["size"]
    lines = [f"working tree {tree:,} bytes, margin {margin:,}: {cap:,} bytes of carries a call"]
    for c, d in enumerate(folders, 1):
        size = sum(p.stat().st_size for p in d.iterdir())
        held = [
            f"{f['name']}" + (f" ({j + 1}/{len(f['pieces'])})" if len(f["pieces"]) > 1 else "")
            for f in files
            for j, p in enumerate(f["pieces"])
            if p["call"] == c
        ]
        left = limit - tree - size
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        lines.append(f"{d.name}: {size:,} bytes, {left:,} left beside the tree: {shown}")
    return lines


def pipeline_specs(stages: Path) -> list[str]:
    """The DEST=PATH specs of a stage file's `#pack DEST=PATH ...` lines, in order."""
    if not stages.is_file():
        raise CarryError(f"{stages}: no such stage file")
    specs = [
        spec
        for line in stages.read_text().splitlines()
        if line.startswith("#pack ")
        for spec in line.split()[1:]
    ]
    if not specs:
        raise CarryError(f"{stages} has no `#pack DEST=PATH ...` line")
    return specs


# ---------------------------------------------------------------------------- device side
def root_dir(root: str) -> Path:
    var, default = ROOTS[root]
    return Path(os.environ.get(var, default))


def pieces_dir() -> Path:
    return Path(os.environ.get("PIECES_DIR", "/tmp/carry-pieces"))


def final_path(entry: dict) -> tuple[Path, Path]:
    """(where the file ends up, where its joined whole waits): the same for a root's files; a
    subfolder's wait in ROOT/.part.SUB, which becomes ROOT/SUB once all of them are in."""
    root, sub = parse_dest(entry["dest"])
    base = root_dir(root)
    if sub is None:
        return base / entry["name"], base / entry["name"]
    return base / sub / entry["name"], base / f".part.{sub}" / entry["name"]


def load_manifest(pieces: Path) -> dict | None:
    path = pieces / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def take_in(folder: Path, pieces: Path) -> dict:
    """Copy `folder`'s pieces into `pieces` (each under a temporary name, then renamed; a piece
    already there is left alone) -> the manifest."""
    mine = json.loads((folder / MANIFEST).read_text())
    pieces.mkdir(parents=True, exist_ok=True)
    known = load_manifest(pieces)
    if known is not None and known["pack"] != mine["pack"]:
        raise CarryError(
            f"{folder} is from pack {mine['pack']}, but {pieces} holds pieces of pack "
            f"{known['pack']}: carry the .kN folders of one `carry_pieces.py pack`"
        )
    for p in sorted(folder.iterdir()):
        dst = pieces / p.name
        if not dst.exists():
            tmp = pieces / f".part.{p.name}"
            shutil.copyfile(p, tmp)
            tmp.rename(dst)
    return mine


def join_ready(manifest: dict, pieces: Path) -> tuple[list[str], list[str], list[str]]:
    """Join every file whose pieces are all in -> (joined now, bad, waiting: name and calls)."""
    joined, bad, waiting = [], [], []
    for e in manifest["files"]:
        final, staged = final_path(e)
        if final.exists() or staged.exists():
            continue  # in place, or in its subfolder that waits for its other files
        parts = [pieces / p["piece"] for p in e["pieces"]]
        missing = sorted({p["call"] for p, f in zip(e["pieces"], parts) if not f.exists()})
        if missing:
            calls = ", ".join(f".k{c}" for c in missing)
            waiting.append(f"{e['dest']}/{e['name']} (pieces in {calls})")
            continue
        staged.parent.mkdir(parents=True, exist_ok=True)
        tmp = staged.with_name(f".joining.{staged.name}")
        with open(tmp, "wb") as out:
            for f in parts:
                with open(f, "rb") as fi:
                    shutil.copyfileobj(fi, out, BUF)
        if tmp.stat().st_size != e["size"] or sha256_file(tmp) != e["sha256"]:
            tmp.unlink()
            bad.append(f"{e['dest']}/{e['name']}: its joined pieces do not match its sha256")
            continue
        tmp.rename(staged)
        for f in parts:
            f.unlink()
        joined.append(f"{e['dest']}/{e['name']}")
    for dest in sorted({e["dest"] for e in manifest["files"] if parse_dest(e["dest"])[1]}):
        mine = [e for e in manifest["files"] if e["dest"] == dest]
        staged = [final_path(e)[1] for e in mine]
        final_dir = final_path(mine[0])[0].parent
        if not final_dir.exists() and all(w.exists() for w in staged):
            staged[0].parent.rename(final_dir)
    return joined, bad, waiting


def complete(manifest: dict | None, dest: str) -> bool:
    """Whether every file of `dest` (a root: its subfolders' files too) is in place."""
    if manifest is None:
        return False
    mine = [e for e in manifest["files"] if e["dest"] == dest or e["dest"].startswith(dest + "/")]
    return bool(mine) and all(final_path(e)[0].exists() for e in mine)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="cut DEST=PATH files into .k1 .. .kN")
    p.add_argument("specs", nargs="*", metavar="DEST=PATH")
    p.add_argument("--pipeline", help="pack what lab/gpu/NAME.stages names on `#pack` lines")
    p.add_argument("--margin-mib", type=float, default=12.0, help="room left in each call")
    p.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]))
    j = sub.add_parser("join", help="take in a carried .kN, join the files whose pieces are in")
    j.add_argument("folder")
    c = sub.add_parser("complete", help="exit 0 once every file of DEST is in place")
    c.add_argument("dest")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "pack":
            if bool(a.specs) == bool(a.pipeline):
                ap.error("pack takes DEST=PATH arguments or --pipeline NAME, one of the two")
            specs = a.specs
            if a.pipeline:
                specs = pipeline_specs(Path(a.repo) / "scripts" / "gpu" / f"{a.pipeline}.stages")
            print("\n".join(pack(specs, Path(a.repo), int(a.margin_mib * 2**20))))
            return 0
        if a.cmd == "complete":
            parse_dest(a.dest)
            return 0 if complete(load_manifest(pieces_dir()), a.dest) else 1
        manifest = take_in(Path(a.folder), pieces_dir())
        joined, bad, waiting = join_ready(manifest, pieces_dir())
    except CarryError as e:
        print(f"carry_pieces: {e}", file=sys.stderr)
        return 2
    print(f"carry_pieces: {a.folder}: joined {len(joined)} files; {len(waiting)} wait")
    for w in waiting[:3]:
        print(f"  waiting: {w}")
    for b in bad:
        print(f"carry_pieces: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
