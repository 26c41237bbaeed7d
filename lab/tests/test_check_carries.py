"""lab/gpu/check_carries.py: a call's bytes are the working tree (tracked and untracked files
git does not ignore, not ignored ones) plus its folders; over the limit or a missing folder
fails."""

import subprocess

from lab.gpu.check_carries import check


def test_counts_the_tree_and_the_folders_against_the_limit(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("/.c1/\n/big/\n")
    (tmp_path / "tracked.txt").write_bytes(b"x" * 1000)
    subprocess.run(["git", "add", "tracked.txt", ".gitignore"], cwd=tmp_path, check=True)
    (tmp_path / "untracked.txt").write_bytes(b"y" * 500)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "ignored.bin").write_bytes(b"z" * 10**6)
    (tmp_path / ".c1").mkdir()
    (tmp_path / ".c1" / "part").write_bytes(b"p" * 3000)
    tree = 1000 + 500 + (tmp_path / ".gitignore").stat().st_size
    lines, ok = check(tmp_path, [".c1"], limit=tree + 3000)
    assert ok and f"{tree + 3000:,} bytes, 0 left: ok" in lines[1]
    lines, ok = check(tmp_path, [".c1"], limit=tree + 2999)
    assert not ok and "OVER" in lines[1]
    lines, ok = check(tmp_path, [".c1,.c2"], limit=10**9)
    assert not ok and "missing .c2" in lines[1]


def test_names_two_folders_of_one_call_share(tmp_path):
    """`cp A/* B/* DST` refuses a second file of one name: the check names it, and fails when the
    two copies differ (which one lands would depend on the copy order)."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    for folder, body in ((".data", b"rows"), (".dr1", b"rows"), (".dr2", b"other")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "heldout.jsonl.gz").write_bytes(body)
    (tmp_path / ".data" / "train.jsonl.gz").write_bytes(b"t")
    lines, ok = check(tmp_path, [".data,.dr1"], limit=10**9)
    assert ok and "both hold heldout.jsonl.gz (.data/heldout.jsonl.gz and .dr1/" in lines[2]
    assert "identical" in lines[2] and len(lines) == 3
    lines, ok = check(tmp_path, [".data,.dr2"], limit=10**9)
    assert not ok and "DIFFERENT" in lines[2]
    lines, ok = check(tmp_path, [".data", ".dr2"], limit=10**9)  # separate calls: no clash
    assert ok and len(lines) == 3
