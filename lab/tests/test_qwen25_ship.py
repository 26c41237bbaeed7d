"""lab/gpu/qwen25_ship.sh and qwen25_restore.sh: a trained run's regenerate and distill folders go
out in parts small enough for one returned file each, without the checkpoints and with the
speculators copy's weights once, and come back byte for byte; a missing or altered part stops the
restore before anything is replaced."""

import filecmp
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "lab" / "gpu"
PART = 15_000_000


def _run(script: str, recipe: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RECIPE_OUT": str(recipe), "OUT": str(recipe.parent / "gpu-out")}
    return subprocess.run(
        ["bash", str(GPU / script), *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def _trained(recipe: Path) -> None:
    rng = os.urandom  # incompressible: the parts' count follows the bytes
    (recipe / "regenerate").mkdir(parents=True)
    (recipe / "regenerate" / "train.jsonl").write_text('{"messages": []}\n' * 1000)
    (recipe / "regenerate" / "done.json").write_text('{"key": "r"}\n')
    run = recipe / "distill" / "run"
    for d in ("final", "final-speculators", "checkpoints/step-000400"):
        (run / d).mkdir(parents=True)
    weights = rng(20_000_000)
    (run / "final" / "model.safetensors").write_bytes(weights)
    (run / "final-speculators" / "model.safetensors").write_bytes(weights)
    (run / "final-speculators" / "config.json").write_text('{"speculators": 1}')
    (run / "checkpoints" / "step-000400" / "optimizer.bin").write_bytes(rng(30_000_000))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (recipe / "distill" / "done.json").write_text('{"key": "d"}\n')


def test_ship_then_restore_gives_the_stage_folders_back_without_checkpoints(tmp_path):
    src, dst, ship = tmp_path / "a" / "recipe", tmp_path / "b" / "recipe", tmp_path / "ship"
    _trained(src)
    r = _run("qwen25_ship.sh", src, str(ship))
    assert r.returncode == 0, r.stderr
    parts = sorted(ship.glob("q25_stages.tar.gz.*"))
    assert all(p.stat().st_size <= PART for p in parts)
    # 20 MB of weights once (not twice, not the 30 MB of optimizer state): two parts
    assert len(parts) == 2, [p.stat().st_size for p in parts]
    r = _run("qwen25_restore.sh", dst, str(ship))
    assert r.returncode == 0, r.stderr
    assert not (dst / "distill" / "run" / "checkpoints").exists()
    for rel in (
        "regenerate/train.jsonl",
        "regenerate/done.json",
        "distill/done.json",
        "distill/run/metrics.jsonl",
        "distill/run/final/model.safetensors",
        "distill/run/final-speculators/model.safetensors",
        "distill/run/final-speculators/config.json",
    ):
        assert filecmp.cmp(src / rel, dst / rel, shallow=False), rel


def test_a_missing_or_altered_part_stops_the_restore_before_anything_is_replaced(tmp_path):
    src, dst, ship = tmp_path / "a" / "recipe", tmp_path / "b" / "recipe", tmp_path / "ship"
    _trained(src)
    assert _run("qwen25_ship.sh", src, str(ship)).returncode == 0
    (dst / "distill").mkdir(parents=True)
    (dst / "distill" / "keep.txt").write_text("an earlier run")
    last = sorted(ship.glob("q25_stages.tar.gz.*"))[-1]
    data = last.read_bytes()
    last.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    r = _run("qwen25_restore.sh", dst, str(ship))
    assert r.returncode == 1 and "does not match SHA256SUMS" in r.stderr
    last.unlink()
    r = _run("qwen25_restore.sh", dst, str(ship))
    assert r.returncode == 1 and last.name in r.stderr
    assert (dst / "distill" / "keep.txt").read_text() == "an earlier run"
