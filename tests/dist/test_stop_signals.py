"""SIGTERM / SIGINT stop a training run after the step under way with its state saved
(`train.loop.stop_signals`): a preempted job keeps its last steps and resumes exactly."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_distill import _train_losses, fast
from tests.tiny_assets import build_tiny_random_target
from train.distill import main
from train.loop.stop_signals import STOP_SIGNALS, StopSignals, agreed_signal

REPO = Path(__file__).resolve().parents[2]


def test_first_signal_is_recorded_the_second_acts_and_handlers_are_put_back():
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.received == signal.SIGINT  # recorded, no KeyboardInterrupt
        assert stop.flags() == [0.0, 1.0]
        with pytest.raises(KeyboardInterrupt):  # the second one does what Ctrl-C does
            signal.raise_signal(signal.SIGINT)
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before


def test_a_second_sigterm_terminates_at_once():
    code = (
        "import signal\n"
        "from train.loop.stop_signals import StopSignals\n"
        "with StopSignals() as stop:\n"
        "    signal.raise_signal(signal.SIGTERM)\n"
        "    print('recorded', int(stop.received), flush=True)\n"
        "    signal.raise_signal(signal.SIGTERM)\n"
        "    print('still running', flush=True)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == -signal.SIGTERM  # killed by the default action
    assert run.stdout == f"recorded {int(signal.SIGTERM)}\n"


def test_the_signal_agreed_over_ranks():
    assert agreed_signal([0.0, 0.0]) is None
    assert agreed_signal([0.0, 2.0]) == signal.SIGINT
    assert agreed_signal([1.0, 1.0]) == signal.SIGTERM  # one rank each: the scheduler's wins


def _wait_for_train_step(proc, metrics: Path, step: int) -> None:
    deadline = time.time() + 240
    while True:
        assert proc.poll() is None, "run ended before the signal"
        assert time.time() < deadline, f"no train step {step} in time"
        if metrics.exists() and any(s >= step for s, _ in _train_losses(metrics.parent)):
            return
        time.sleep(0.05)


@pytest.mark.parametrize(
    "how",
    [
        pytest.param("sigterm", id="SIGTERM to the trainer (a scheduler)"),
        pytest.param("sigint-group", id="SIGINT to its process group, 2 loader workers (Ctrl-C)"),
    ],
)
def test_a_signal_saves_the_step_and_the_run_resumes_exactly(target, tmp_path, how):
    """No periodic checkpoint (save_every=0), so without the handler nothing would be kept: the
    signal mid-run exits 128 + its number after saving the step it stopped at, and resume=true
    reproduces an uninterrupted run's loss curve (evaluations every 2 steps, skipped where due at
    the stop). Ctrl-C reaches the data-loader workers too: none may die of it."""
    sig = signal.SIGTERM if how == "sigterm" else signal.SIGINT
    workers = [] if how == "sigterm" else ["trainer.num_workers=2"]
    steps = ["trainer.max_steps=8", "trainer.save_every=0", "trainer.eval_every=2", *workers]
    ref = tmp_path / "ref"
    assert main(fast(target, ref, *steps)) == 0

    out = tmp_path / "stopped"
    # Each step followed by a 1 s pause (tests/slow_steps.py), so the signal lands mid-run.
    cmd = [sys.executable, "-m", "tests.slow_steps", "1.0", *fast(target, out, *steps)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        _wait_for_train_step(proc, out / "metrics.jsonl", 2)
        if how == "sigterm":
            proc.send_signal(sig)
        else:
            os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group: workers left by a failure too
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err[-3000:]
    stopped_at = max(s for s, _ in _train_losses(out))
    assert 2 <= stopped_at < 8
    assert f"stopped by {sig.name} after step {stopped_at}" in err
    assert err.count(f"[distill] {sig.name}: stopping after this step") == 1  # workers say nothing
    ckpt = f"step-{stopped_at:06d}"
    assert (out / "checkpoints" / "LAST_GOOD").read_text().strip() == ckpt
    assert not (out / "final").exists()  # no export of a cut run
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1] == {"step": stopped_at, "split": "stop", "signal": sig.name}

    assert main(fast(target, out, *steps, "resume=true")) == 0
    assert _train_losses(out) == _train_losses(ref)


@pytest.mark.slow
def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    """Rank 1 alone gets SIGTERM during step 3 (grad_accum=1): both ranks save step 3 and stop
    (no rank waits in a collective for the other); resume=true finishes the run."""
    target = build_tiny_random_target(tmp_path / "t")
    common = [
        "trainer.max_steps=5",
        "trainer.eval_every=0",
        "data.heldout=null",
        "export.speculators=false",
        "trainer.micro_batch_size=2",
        "trainer.distributed=ddp",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env_signal = {**env, "DSPARK_TEST_SIGNAL_CALL": "3", "DSPARK_TEST_SIGNAL_RANK": "1"}
    out = tmp_path / "run"

    def torchrun(module, *extra, port, env):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        cmd += ["--master-port", str(port), "-m", module, *fast(target, out, *common, *extra)]
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)

    stopped = torchrun("tests.dist.signal_one_rank", port=29520, env=env_signal)
    log = stopped.stdout + stopped.stderr
    assert stopped.returncode != 0
    assert log.count("stopped by SIGTERM after step 3") == 2, log[-3000:]  # each rank says so
    assert (out / "checkpoints" / "LAST_GOOD").read_text().strip() == "step-000003"
    assert [s for s, _ in _train_losses(out)] == [1, 2, 3]
    resumed = torchrun("train.distill", "resume=true", port=29521, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [s for s, _ in _train_losses(out)] == [1, 2, 3, 4, 5]
    assert (out / "final" / "model.safetensors").exists()
