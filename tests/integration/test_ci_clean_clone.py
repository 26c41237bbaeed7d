"""scripts/ci_clean_clone.sh removes its clone and stops everything .ci/run started, whether
.ci/run ends by itself or the script is killed (TERM) mid-run.

Killing the script alone used to leave .ci/run and its tests running, and they could write into the
clone after its removal. Here a throw-away repository's .ci/run starts a background `sleep` (as a
test's server would be) and records its pid outside the clone.
"""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ci_clean_clone.sh"

CI_RUN = """#!/usr/bin/env bash
sleep 300 &
echo $! > "$MARKS/child.pid"
touch "$MARKS/started"
[[ -n "${HANG:-}" ]] && sleep 300
exit 3
"""


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for init, which may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture()
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "scripts").mkdir(parents=True)
    (r / ".ci").mkdir()
    shutil.copy(SCRIPT, r / "scripts" / "ci_clean_clone.sh")
    (r / ".ci" / "run").write_text(CI_RUN)
    git = ["git", "-C", str(r), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "ci stand-in"], check=True)
    return r


def start(repo: Path, marks: Path, hang: bool) -> tuple[subprocess.Popen, Path]:
    marks.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HANG"}
    env["MARKS"] = str(marks)
    if hang:
        env["HANG"] = "1"
    proc = subprocess.Popen(
        ["bash", str(repo / "scripts" / "ci_clean_clone.sh"), "HEAD", str(marks / "ci.log")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    first = proc.stdout.readline()
    m = re.search(r" in (/tmp/ci_clone\.\w+);", first)
    assert m, first
    return proc, Path(m.group(1))


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_run_that_ends_leaves_no_clone_and_no_process(repo, tmp_path):
    proc, clone = start(repo, tmp_path / "marks", hang=False)
    assert proc.wait(timeout=60) == 3  # .ci/run's exit code
    child = int((tmp_path / "marks" / "child.pid").read_text())
    assert not clone.exists()
    assert not running(child)


def test_killing_the_script_stops_ci_run_and_its_children_then_removes_the_clone(repo, tmp_path):
    proc, clone = start(repo, tmp_path / "marks", hang=True)
    wait_for(tmp_path / "marks" / "started")
    assert clone.exists()
    child = int((tmp_path / "marks" / "child.pid").read_text())
    assert running(child)
    proc.send_signal(signal.SIGTERM)  # the script only, not its process group
    assert proc.wait(timeout=60) == 143
    assert not clone.exists()
    assert not running(child)
