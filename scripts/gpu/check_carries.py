"""Check, before a session, that every planned device call fits its 64 MiB: a call carries the
working tree (tracked files and untracked ones git does not ignore) plus the folders it names.

    python3 scripts/gpu/check_carries.py .whl,.gg1,.head .gg2,.data .c1a .c1b .c2a .c2b .c3 .c4

One argument per call, its carried folders joined by commas. Prints each call's bytes and what is
left; exit 1 if a call is over (halve a folder with scripts/gpu/halve_carry.sh) or a folder is
missing. On 2026-12-04 two calls were refused mid-session: 60 MB folders had fitted until the
tracked files grew to 8 MB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 1024 * 1024


def tree_bytes(repo: Path) -> int:
    """Bytes of the files a device call copies whatever it carries."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    files = {repo / name.decode() for name in out.split(b"\0") if name}
    return sum(f.stat().st_size for f in files if f.is_file())


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check(repo: Path, calls: list[str], limit: int = LIMIT) -> tuple[list[str], bool]:
    tree = tree_bytes(repo)
    lines, ok = [f"working tree: {tree:,} bytes; limit {limit:,}"], True
    for i, call in enumerate(calls, 1):
        folders = [f for f in call.split(",") if f]
        missing = [f for f in folders if not (repo / f).is_dir()]
        if missing:
            lines.append(f"call {i} ({call}): missing {', '.join(missing)}")
            ok = False
            continue
        total = tree + sum(folder_bytes(repo / f) for f in folders)
        verdict = "ok" if total <= limit else "OVER"
        ok &= total <= limit
        lines.append(f"call {i} ({call}): {total:,} bytes, {limit - total:,} left: {verdict}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calls", nargs="+", help="one per call: FOLDER[,FOLDER...]")
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]))
    a = ap.parse_args(argv)
    lines, ok = check(Path(a.repo), a.calls)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
