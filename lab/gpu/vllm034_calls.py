#!/usr/bin/env python3
"""Print the device calls that bring vLLM 0.34 to the H200: one per carry folder, back to back.

lab/gpu/vllm034_prepare.sh made the git-ignored folders .v34_01 .. .v34_NN (each < 60 MB)
and the manifest .v34_01/V34_MANIFEST. Each call carries one folder and copies it to /tmp/v34.
The first starts /tmp/v34 afresh; the others stop at once if /tmp/v34 is gone (the machine is
given back after 30 s idle, /tmp with it); the last also runs lab/gpu/vllm034_install.sh.

    python3 lab/gpu/vllm034_calls.py               # the calls, readable
    python3 lab/gpu/vllm034_calls.py --json        # [{carry, command, timeout_s}, ...]
    python3 lab/gpu/vllm034_calls.py --then CMD    # the last call then runs CMD, with
                                                       # vLLM 0.34 in use (use_vllm034)

Before printing it checks that the folders are the ones the manifest names, with the part sizes
it lists, and that each call (its folder plus what travels anyway: tracked files and untracked
files git does not ignore) stays under the device tool's 64 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

LIMIT = 64 * 1024 * 1024  # the device tool's working-tree limit per call
CMD_LIMIT = 2000  # characters per device command
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INSTALL = "lab/gpu/vllm034_install.sh"
GONE = (
    "test -f /tmp/v34/V34_MANIFEST || "
    "{ echo '[v34] /tmp/v34 is gone (a fresh machine): start again at call 1'; exit 3; }; "
)


def travelling_bytes() -> int:
    """Bytes that travel with every call: tracked files and untracked files git does not ignore."""
    cmd = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, check=True).stdout
    total = 0
    for rel in filter(None, out.split(b"\0")):
        path = os.path.join(REPO, os.fsdecode(rel))
        if os.path.isfile(path) and not os.path.islink(path):
            total += os.path.getsize(path)
    return total


def read_manifest(first: str) -> dict[str, list[tuple[str, int]]]:
    """Parts per folder, as the manifest lists them."""
    per: dict[str, list[tuple[str, int]]] = {}
    with open(os.path.join(REPO, first, "V34_MANIFEST")) as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] == "part":
                _, _, size, folder, name = fields
                per.setdefault(folder, []).append((name, int(size)))
    return per


def check_folder(folder: str, parts: list[tuple[str, int]]) -> int:
    """The folder's bytes, after checking it holds exactly the manifest's parts, at their sizes."""
    here = os.path.join(REPO, folder)
    for name, size in parts:
        path = os.path.join(here, name)
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            sys.exit(f"{folder}/{name}: missing or not {size} bytes: run the prepare script again")
    extra = set(os.listdir(here)) - {name for name, _ in parts} - {"V34_MANIFEST"}
    if extra:
        sys.exit(f"{folder} holds files the manifest does not name: {sorted(extra)}")
    return sum(os.path.getsize(os.path.join(here, name)) for name in os.listdir(here))


def calls(then: str | None) -> list[dict]:
    folders = sorted(d for d in os.listdir(REPO) if re.fullmatch(r"\.v34_\d\d", d))
    if not folders or not os.path.isfile(os.path.join(REPO, folders[0], "V34_MANIFEST")):
        sys.exit("no .v34_01/V34_MANIFEST here: run  bash lab/gpu/vllm034_prepare.sh  first")
    n = len(folders)
    if folders != [f".v34_{i:02d}" for i in range(1, n + 1)]:
        sys.exit(f"carry folders are not numbered 01..{n:02d}: {folders}")
    per = read_manifest(folders[0])
    if sorted(per) != folders:
        sys.exit(f"the manifest names {sorted(per)}, here are {folders}: prepare again")
    base = travelling_bytes()
    out = []
    for i, folder in enumerate(folders, 1):
        size = base + check_folder(folder, per[folder])
        if size >= LIMIT:
            sys.exit(
                f"call {i} would carry {size} bytes (>= {LIMIT}): prepare again with a "
                "smaller V34_CALL_BYTES, or leave untracked files out"
            )
        copy = (
            f"cp {folder}/* /tmp/v34/ && "
            f'echo "[v34] call {i}/{n}: $(ls /tmp/v34 | wc -l) files in /tmp/v34"'
        )
        cmd = f"rm -rf /tmp/v34 && mkdir -p /tmp/v34 && {copy}" if i == 1 else GONE + copy
        timeout = 120
        if i == n:
            cmd += f" && bash {INSTALL}"
            if then:
                cmd += f" && source {INSTALL} && use_vllm034 && {then}"
            timeout = 600
        if len(cmd) > CMD_LIMIT:
            sys.exit(f"call {i}'s command is {len(cmd)} characters (limit {CMD_LIMIT})")
        out.append(
            {"call": i, "carry": [folder], "command": cmd, "timeout_s": timeout, "bytes": size}
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true", help="print the calls as JSON")
    ap.add_argument("--then", help="what the last call runs after the install, with vLLM 0.34")
    args = ap.parse_args()
    seq = calls(args.then)
    if args.json:
        keys = ("carry", "command", "timeout_s")
        print(json.dumps([{k: c[k] for k in keys} for c in seq], indent=1))
        return
    biggest = max(c["bytes"] for c in seq)
    sent = sum(c["bytes"] for c in seq) / 1e6
    print(f"# {len(seq)} device calls, back to back (the machine goes back after 30 s idle).")
    print(f"# One folder a call; largest call {biggest} bytes of {LIMIT}; {sent:.0f} MB in all.")
    print("# A call that exits 3 ('/tmp/v34 is gone') met a fresh machine: start again at call 1.")
    for c in seq:
        print(
            f"\ncall {c['call']}/{len(seq)}  carry: {json.dumps(c['carry'])}  "
            f"timeout_s: {c['timeout_s']}"
        )
        print(f"  {c['command']}")


if __name__ == "__main__":
    main()
