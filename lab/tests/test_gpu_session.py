"""lab/gpu/session.sh: every call of a device session runs the same line with its own carry,
so a call that gets no machine (the first of a batch, on 2026-12-05) costs only its carry. Played
here with a pipeline whose stage waits for files that calls packed by carry_pieces.py bring."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from lab.gpu.carry_pieces import SLACK, pack

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "lab" / "gpu"
SCRIPTS = ("session.sh", "run_all.sh", "env.sh", "poll.sh", "vllm_install.sh")
# What carry_pieces.py imports, at their places in the repo.
MODULES = (
    "common/__init__.py",
    "common/atomic_file.py",
    "lab/__init__.py",
    "lab/gpu/carry_pieces.py",
    "lab/gpu/check_carries.py",
    "train/__init__.py",
    "train/publish/package_files.py",
)


@pytest.fixture
def machine(tmp_path):
    """A repo with a one-stage pipeline, the device's /tmp folders redirected into tmp_path, and
    two files packed one a call (.k1 brings `one`, .k2 `two`) in tmp_path / "packed"."""
    repo = tmp_path / "repo"
    gpu = repo / "lab" / "gpu"
    gpu.mkdir(parents=True)
    for name in SCRIPTS:
        (gpu / name).write_text((GPU / name).read_text())
    for rel in MODULES:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text((REPO / rel).read_text())
    carry = tmp_path / "carry"
    (gpu / "join.sh").write_text(
        "source lab/gpu/env.sh\n"
        f"wait_for_files 60 {carry}/one {carry}/two || exit 1\n"
        f'cat {carry}/one {carry}/two >"$OUT/joined"\n'
    )
    (gpu / "join.stages").write_text("join join.sh\n")
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "one").write_text("1" * 1000)
    (packed / "two").write_text("2" * 1000)
    pack([f"carry={packed / 'one'}", f"carry={packed / 'two'}"], packed, 0, 0, 1000 + SLACK)
    env = {
        "PATH": "/usr/bin:/bin",
        "RES": str(tmp_path / "res"),
        "WORK": str(repo),
        "OUT": str(tmp_path / "out"),
        "CARRY_DIR": str(carry),
        "VX_DIR": str(tmp_path / "vx"),
        "PIECES_DIR": str(tmp_path / "pieces"),
        "DEADLINE_FILE": str(tmp_path / "deadline"),
        "STARTED_DIR": str(tmp_path / "started"),
    }
    return repo, env, tmp_path


def session(repo: Path, env: dict, pipeline: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "lab/gpu/session.sh", pipeline],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )


def call(repo: Path, env: dict, folder: str, rc: int = 0) -> str:
    """One device call: the packed folder appears in the tree, the session line runs, the folder
    goes again (the next call carries its own)."""
    shutil.copytree(repo.parent / "packed" / folder, repo / folder)
    done = session(repo, env, "join")
    shutil.rmtree(repo / folder)
    assert done.returncode == rc, done.stderr
    return done.stdout


def poll(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(GPU / "poll.sh"), "60"], env=env, capture_output=True, text=True
    )


def test_the_first_call_starts_and_a_later_one_feeds_the_pipeline(machine):
    repo, env, tmp = machine
    first = call(repo, env, ".k1")
    assert "took .k1" in first and "started join" in first and "1 wait" in first
    deadline = (tmp / "deadline").read_text()
    second = call(repo, env, ".k2")
    assert "took .k2" in second and "started by an earlier call" in second
    assert (tmp / "deadline").read_text() == deadline  # written once, by the first call
    done = poll(env)
    assert done.returncode == 0 and "end join rc=0" in done.stdout, done.stdout
    assert (tmp / "res" / "joined").read_text() == "1" * 1000 + "2" * 1000


def test_a_lost_first_call_costs_only_its_carry(machine):
    """The call carrying .k1 never ran: the next call starts the pipeline, whose stage waits for
    what a later call brings rather than failing."""
    repo, env, tmp = machine
    assert "started join" in call(repo, env, ".k2")
    call(repo, env, ".k1")  # carried again later
    assert "end join rc=0" in poll(env).stdout
    assert (tmp / "res" / "joined").read_text() == "1" * 1000 + "2" * 1000


def test_a_call_carried_twice_rewrites_nothing(machine):
    repo, env, tmp = machine
    call(repo, env, ".k1")
    before = os.stat(tmp / "carry" / "one").st_mtime_ns
    time.sleep(0.05)
    again = call(repo, env, ".k1")
    assert os.stat(tmp / "carry" / "one").st_mtime_ns == before
    assert "took .k1" in again and "joined 0 files" in again
    call(repo, env, ".k2")
    assert "end join rc=0" in poll(env).stdout


def test_a_damaged_call_fails_and_its_file_never_shows(machine):
    """A piece that does not match the manifest's sha256: the call exits 1 naming the file, the
    pipeline still starts, and its stage names what never came instead of reading a bad file."""
    repo, env, tmp = machine
    piece = next(p for p in (tmp / "packed" / ".k2").iterdir() if p.name != "carry.json")
    piece.write_text("x" * 1000)
    call(repo, env, ".k1")
    out = call(repo, env, ".k2", rc=1)
    assert "started by an earlier call" in out
    assert not (tmp / "carry" / "two").exists()


def test_an_unknown_pipeline_is_refused(machine):
    repo, env, _ = machine
    done = session(repo, env, "nope")
    assert done.returncode == 2 and "no lab/gpu/nope.stages" in done.stderr


def test_a_poll_follows_a_real_pipeline_to_its_end(machine):
    """run_all.sh leaves the pid the polls watch: a poll of a running pipeline returns at DONE."""
    repo, env, tmp = machine
    gpu = repo / "lab" / "gpu"
    (gpu / "nap.sh").write_text('sleep 3; echo napped >"$OUT/nap.txt"\n')
    (gpu / "nap.stages").write_text("nap nap.sh\n")
    res = tmp / "res"
    subprocess.Popen(["bash", "lab/gpu/run_all.sh", "nap"], cwd=repo, env=env)
    for _ in range(100):  # the pid file is the pipeline's first act
        if (res / "pipeline.pid").exists():
            break
        time.sleep(0.05)
    started = time.monotonic()
    done = poll(env)
    assert done.returncode == 0, done.stdout
    assert 1 < time.monotonic() - started < 30  # waited for the stage, not the limit
    assert "end nap rc=0" in done.stdout and (res / "nap.txt").read_text() == "napped\n"
