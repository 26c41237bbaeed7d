"""scripts/gpu/session.sh: every call of a device session runs the same line with its own carry,
so a call that gets no machine (the first of a batch, on 2026-12-05) costs only its carry. Played
here with a pipeline whose stage waits for a file a later call brings."""

import os
import subprocess
import time
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[1] / "scripts" / "gpu"
SCRIPTS = ("session.sh", "run_all.sh", "env.sh", "poll.sh", "vllm_install.sh")


@pytest.fixture
def machine(tmp_path):
    """A repo with a one-stage pipeline and the device's /tmp folders redirected into tmp_path."""
    repo = tmp_path / "repo"
    gpu = repo / "scripts" / "gpu"
    gpu.mkdir(parents=True)
    for name in SCRIPTS:
        (gpu / name).write_text((GPU / name).read_text())
    carry = tmp_path / "carry"
    (gpu / "join.sh").write_text(
        "source scripts/gpu/env.sh\n"
        f"wait_for_files 60 {carry}/one {carry}/two || exit 1\n"
        f'cat {carry}/one {carry}/two >"$OUT/joined"\n'
    )
    (gpu / "join.stages").write_text("join join.sh\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "RES": str(tmp_path / "res"),
        "WORK": str(repo),
        "OUT": str(tmp_path / "out"),
        "CARRY_DIR": str(carry),
        "VX_DIR": str(tmp_path / "vx"),
        "DEADLINE_FILE": str(tmp_path / "deadline"),
        "STARTED_DIR": str(tmp_path / "started"),
    }
    return repo, env, tmp_path


def session(repo: Path, env: dict, pipeline: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/gpu/session.sh", pipeline],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )


def call(repo: Path, env: dict, carry: dict[str, dict[str, str]]) -> str:
    """One device call: the carried folders appear in the tree, the session line runs, the
    folders go again (the next call carries its own)."""
    for folder, files in carry.items():
        (repo / folder).mkdir()
        for name, text in files.items():
            (repo / folder / name).write_text(text)
    done = session(repo, env, "join")
    for folder in carry:
        for f in (repo / folder).iterdir():
            f.unlink()
        (repo / folder).rmdir()
    assert done.returncode == 0, done.stderr
    return done.stdout


def poll(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(GPU / "poll.sh"), "60"], env=env, capture_output=True, text=True
    )


def test_the_first_call_starts_and_a_later_one_feeds_the_pipeline(machine):
    repo, env, tmp = machine
    first = call(repo, env, {".gg1": {"one": "1"}})
    assert "took .gg1" in first and "started join" in first
    deadline = (tmp / "deadline").read_text()
    second = call(repo, env, {".gg2": {"two": "2"}})
    assert "took .gg2" in second and "started by an earlier call" in second
    assert (tmp / "deadline").read_text() == deadline  # written once, by the first call
    done = poll(env)
    assert done.returncode == 0 and "end join rc=0" in done.stdout, done.stdout
    assert (tmp / "res" / "joined").read_text() == "12"


def test_a_lost_first_call_costs_only_its_carry(machine):
    """The call carrying .gg1 never ran: the next call starts the pipeline, whose stage says what
    never came rather than waiting out the session."""
    repo, env, tmp = machine
    assert "started join" in call(repo, env, {".gg2": {"two": "2"}})
    call(repo, env, {".gg1": {"one": "1"}})  # a later call may carry it again
    assert "end join rc=0" in poll(env).stdout
    assert (tmp / "res" / "joined").read_text() == "12"


def test_a_file_already_taken_in_is_not_rewritten(machine):
    repo, env, tmp = machine
    call(repo, env, {".gg1": {"one": "1"}, ".whl": {"a.whl": "w"}})
    before = os.stat(tmp / "carry" / "one").st_mtime_ns
    time.sleep(0.05)
    again = call(repo, env, {".gg1": {"one": "changed"}, ".whl": {"a.whl": "w2"}})
    assert (tmp / "carry" / "one").read_text() == "1"
    assert os.stat(tmp / "carry" / "one").st_mtime_ns == before
    assert (tmp / "carry" / ".whl" / "a.whl").read_text() == "w"
    assert ".part." not in " ".join(p.name for p in (tmp / "carry").iterdir())
    assert "took .gg1" in again
    call(repo, env, {".gg2": {"two": "2"}})
    assert "end join rc=0" in poll(env).stdout


def test_an_unknown_pipeline_is_refused(machine):
    repo, env, _ = machine
    done = session(repo, env, "nope")
    assert done.returncode == 2 and "no scripts/gpu/nope.stages" in done.stderr


def test_a_poll_follows_a_real_pipeline_to_its_end(machine):
    """run_all.sh leaves the pid the polls watch: a poll of a running pipeline returns at DONE."""
    repo, env, tmp = machine
    gpu = repo / "scripts" / "gpu"
    (gpu / "nap.sh").write_text('sleep 3; echo napped >"$OUT/nap.txt"\n')
    (gpu / "nap.stages").write_text("nap nap.sh\n")
    res = tmp / "res"
    subprocess.Popen(["bash", "scripts/gpu/run_all.sh", "nap"], cwd=repo, env=env)
    for _ in range(100):  # the pid file is the pipeline's first act
        if (res / "pipeline.pid").exists():
            break
        time.sleep(0.05)
    started = time.monotonic()
    done = poll(env)
    assert done.returncode == 0, done.stdout
    assert 1 < time.monotonic() - started < 30  # waited for the stage, not the limit
    assert "end nap rc=0" in done.stdout and (res / "nap.txt").read_text() == "napped\n"
