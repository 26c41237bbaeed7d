"""Issue 8, the CPU part: DDP distillation on 2 gloo processes (torchrun) is the same computation as
one process with the same global batch. Anchors are keyed by row content and the loss divides
global (num, den) sums, so the loss curves agree to float summation order."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_distill import fast
from tests.tiny_assets import build_tiny_random_target

REPO = Path(__file__).resolve().parents[2]
STEPS = 5


def losses(out: Path) -> list[float]:
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["split"] == "train"]


def run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]


@pytest.mark.slow
def test_ddp_on_two_gloo_processes_matches_one_process(tmp_path):
    target = build_tiny_random_target(tmp_path / "t")
    common = [
        f"trainer.max_steps={STEPS}",
        "trainer.eval_every=0",
        "data.heldout=null",
        "export.speculators=false",
        "trainer.grad_accum=2",
    ]
    single = tmp_path / "single"
    run(
        [
            sys.executable,
            "-m",
            "train.distill",
            *fast(target, single, *common, "trainer.micro_batch_size=4"),
        ]
    )
    ddp = tmp_path / "ddp"
    run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            "29517",
            "-m",
            "train.distill",
            *fast(target, ddp, *common, "trainer.micro_batch_size=2", "trainer.distributed=ddp"),
        ]
    )
    a, b = losses(single), losses(ddp)
    assert len(a) == len(b) == STEPS
    assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
    assert a[0] != a[-1]  # the run trained, so agreement over steps tests the updates too
    assert (ddp / "final" / "model.safetensors").exists()


@pytest.mark.slow
def test_nan_on_one_rank_stops_or_skips_on_every_rank(tmp_path):
    """Rank 1's loss turns NaN at step 3 (grad_accum=1): both ranks stop at step 3 naming the rows
    of the global batch (no rank hangs in a collective); with max_bad_batches=1 both skip it and
    finish in step."""
    target = build_tiny_random_target(tmp_path / "t")
    common = [
        "trainer.max_steps=4",
        "trainer.eval_every=0",
        "data.heldout=null",
        "export.speculators=false",
        "trainer.micro_batch_size=2",
        "trainer.distributed=ddp",
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "DSPARK_TEST_NAN_CALL": "3",
        "DSPARK_TEST_NAN_RANK": "1",
    }

    def torchrun(out, *extra, port):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        cmd += ["--master-port", str(port), "-m", "tests.dist.diverge_one_rank"]
        cmd += fast(target, out, *common, *extra)
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)

    stopped = torchrun(tmp_path / "stop", port=29518)
    assert stopped.returncode != 0
    err = stopped.stdout + stopped.stderr
    assert "training diverged at step 3" in err, err[-3000:]
    rows = json.loads(err.split("training rows ")[1].split("]")[0] + "]")
    assert len(rows) == 4  # 2 ranks x micro batch 2: the global batch
    assert (tmp_path / "stop" / "checkpoints" / "LAST_GOOD").read_text().strip() == "step-000002"
    skipped = torchrun(tmp_path / "skip", "trainer.max_bad_batches=1", port=29519)
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["split"] == "train"] == [1, 2, 3, 4]
    assert [r["bad_batches"] for r in recs if r["split"] == "skip"] == [1]
