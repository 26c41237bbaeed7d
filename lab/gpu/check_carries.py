"""Check, before a session, that every planned device call fits its 64 MiB: a call carries the
working tree (tracked files and untracked ones git does not ignore) plus the folders it names.

    python3 lab/gpu/check_carries.py .k1 .k2 .k3 .k4,.head

One argument per call, its carried folders joined by commas. Prints each call's bytes and what is
left; exit 1 if a call is over (pack again: lab/gpu/carry_pieces.py) or a folder is missing.
On 2026-12-04 two calls were refused mid-session: 60 MB folders had fitted until the
tracked files grew to 8 MB.

It also names files that two folders of one call both hold: `cp A/* B/* /tmp/carry/` refuses
to copy a second file of the same name ("will not overwrite just-created"), which on the evening
of 2026-12-04 stopped a call's `&&` chain before it started the pipeline. Identical copies are
noted (copy each folder with its own `cp`); different contents under one name fail the check.
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


def shared_names(repo: Path, folders: list[str]) -> tuple[list[str], bool]:
    """Lines for the top-level file names two of `folders` both hold, and whether all those
    copies are byte-identical."""
    seen: dict[str, Path] = {}
    lines, same = [], True
    for f in folders:
        for path in sorted(p for p in (repo / f).iterdir() if p.is_file()):
            first = seen.setdefault(path.name, path)
            if first is path:
                continue
            identical = first.read_bytes() == path.read_bytes()
            same &= identical
            how = "identical: copy each folder with its own cp" if identical else "DIFFERENT"
            rel = f"{first.relative_to(repo)} and {path.relative_to(repo)}"
            lines.append(f"  both hold {path.name} ({rel}), {how}")
    return lines, same


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
        shared, same = shared_names(repo, folders)
        lines += shared
        ok &= same
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
