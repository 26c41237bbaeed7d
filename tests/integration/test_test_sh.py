"""scripts/test.sh runs the venv steps (build .venv-vllm, build .venv-interop, the vLLM suite, the
interop suite) in the background beside the CPU suite. What it must keep doing: show their log after
the CPU suite, fail when any of them fails (a failed build skips only its own suite), and stop them
when it exits early, leaving no process behind.

Here the real scripts/test.sh runs in a throw-away folder whose runner scripts are stand-ins, with a
`python3` stand-in first on PATH (pip, ruff and the CPU suite); each step appends its name to
$MARKS/steps and exits with the code the test asks for.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_ci_clean_clone import running, wait_for

REPO = Path(__file__).resolve().parents[2]

PYTHON3 = """#!/usr/bin/env bash
case "$*" in
  *"-m pytest"*)
    echo cpu >> "$MARKS/steps"
    # Fails (CPU_RC) once the vLLM suite is under way, when told to wait for it.
    if [[ -n "${CPU_WAITS:-}" ]]; then
      while [[ ! -f "$MARKS/vllm-suite.pid" ]]; do sleep 0.05; done
    fi
    echo "cpu suite output"
    exit "${CPU_RC:-0}" ;;
esac
exit 0
"""

# scripts/test_vllm.sh and scripts/test_interop.sh: NAME is vllm or interop.
RUNNER = """#!/usr/bin/env bash
if [[ "${1:-}" == --build-only ]]; then
  echo "NAME build log line" && echo NAME-build >> "$MARKS/steps"
  exit "${NAME_BUILD_RC:-0}"
fi
echo "NAME suite log line" && echo NAME-suite >> "$MARKS/steps"
if [[ -n "${NAME_SUITE_HANGS:-}" ]]; then
  sleep 300 &
  echo $! > "$MARKS/NAME-suite.pid"
  wait
fi
exit "${NAME_SUITE_RC:-0}"
"""


@pytest.fixture()
def tree(tmp_path):
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", root / "scripts" / "test.sh")
    (root / "scripts" / "fetch_vllm_oracle.sh").write_text("exit 0\n")
    for name in ("vllm", "interop"):
        (root / "scripts" / f"test_{name}.sh").write_text(RUNNER.replace("NAME", name))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(PYTHON3)
    (bin_dir / "python3").chmod(0o755)
    marks = tmp_path / "marks"
    marks.mkdir()
    return root, bin_dir, marks


def run(tree, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    root, bin_dir, marks = tree
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MARKS": str(marks), **env}
    done = subprocess.run(
        ["bash", str(root / "scripts" / "test.sh")],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    steps_file = marks / "steps"
    steps = steps_file.read_text().split() if steps_file.exists() else []
    return done, steps


def test_every_step_runs_and_the_background_log_follows_the_cpu_suite(tree):
    done, steps = run(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(steps) == sorted(
        ["cpu", "vllm-build", "interop-build", "vllm-suite", "interop-suite"]
    )
    out = done.stdout
    order = [
        "cpu suite output",
        "vllm build log line",
        "interop build log line",
        "vllm suite log line",
        "interop suite log line",
    ]
    assert all(line in out for line in order), out
    assert [out.index(line) for line in order] == sorted(out.index(line) for line in order)


def test_a_failed_venv_build_fails_and_skips_only_its_own_suite(tree):
    done, steps = run(tree, vllm_BUILD_RC="7")
    assert done.returncode == 1
    assert "vllm build log line" in done.stdout  # its log is shown
    assert "vllm-suite" not in steps and "interop-suite" in steps
    assert "scripts/test_vllm.sh --build-only (in the background): exit 7" in done.stderr
    assert "scripts/test_vllm.sh (in the background): skipped (its venv build failed)" in (
        done.stderr
    )


@pytest.mark.parametrize("name", ["vllm", "interop"])
def test_a_failed_background_suite_fails_the_script(tree, name):
    done, _ = run(tree, **{f"{name}_SUITE_RC": "1"})
    assert done.returncode == 1
    assert f"{name} suite log line" in done.stdout
    assert f"scripts/test_{name}.sh (in the background): exit 1" in done.stderr


def test_a_failed_cpu_suite_stops_the_background_steps_and_leaves_no_process(tree):
    _, _, marks = tree
    done, steps = run(tree, CPU_RC="1", CPU_WAITS="1", vllm_SUITE_HANGS="1")
    assert done.returncode == 1
    assert "stopping the background steps" in done.stderr
    wait_for(marks / "vllm-suite.pid")
    child = int((marks / "vllm-suite.pid").read_text())
    # TERM reached it before the script exited; under load it may take a moment to go (its own
    # hang is 300 s, so a child never stopped still fails here)
    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child)
    assert "interop-suite" not in steps
