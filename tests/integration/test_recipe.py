"""`python -m train.recipe tiny` end to end on CPU, then what a rerun does: skip done stages,
`--from/--until`, a changed setting invalidating the later stages, and a SIGKILL in the middle of
regenerate continued by the same command. serve.evaluate runs where the repo has it; otherwise the
evaluate stage is given no splits (it is another command's job) and export writes a card without
figures."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest
import torch

from tests.recipe_data import write_humaneval, write_sharegpt
from train.recipe import run as recipe
from train.recipe.config import STAGES

ROOT = Path(__file__).resolve().parents[2]
HAS_EVALUATE = (ROOT / "serve" / "evaluate.py").is_file()
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
}


def _cmd(out: Path, src: Path, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "train.recipe", "tiny", "--out", str(out), *extra]
    args += [f"prompts.chat.file={src / 'sharegpt.json'}"]
    args += [f"prompts.code.humaneval_file={src / 'humaneval.jsonl.gz'}"]
    return args + ([] if HAS_EVALUATE else ["evaluate.splits=[]"])


def _run(out: Path, src: Path, *extra: str, code: int = 0) -> str:
    done = subprocess.run(_cmd(out, src, *extra), cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
    return "\n".join(line for line in done.stdout.splitlines() if line.startswith("[recipe]"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    src = tmp_path_factory.mktemp("sources")
    write_sharegpt(src / "sharegpt.json")
    write_humaneval(src / "humaneval.jsonl.gz")
    out = tmp_path_factory.mktemp("recipe") / "out"
    log = _run(out, src)
    return out, src, log


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _user_texts(row) -> list[str]:
    return [
        " ".join(unicodedata.normalize("NFKC", m["content"]).casefold().split())
        for m in row["messages"]
        if m["role"] == "user"
    ]


def test_end_to_end_runs_every_stage_and_writes_its_outputs(tiny):
    out, _, log = tiny
    for stage in STAGES:
        assert f"[recipe] {stage}: start" in log and f"[recipe] {stage}: done" in log
        done = json.loads((out / stage / "done.json").read_text())
        assert {"key", "commands", "versions", "seconds", "outputs"} <= set(done)
    assert (out / "target" / "model" / "config.json").is_file()
    assert len(_rows(out / "regenerate" / "train.jsonl")) == len(
        _rows(out / "prompts" / "train.jsonl")
    )
    assert (out / "distill" / "run" / "final" / "model.safetensors").is_file()
    assert (out / "export" / "draft" / "README.md").is_file()
    if HAS_EVALUATE:
        assert (out / "evaluate" / "test" / "eval.json").is_file()


def test_export_calibrates_the_confidence_head_into_its_weights(tiny):
    """The exported head is the trained one divided by the fitted temperature (what vLLM reads),
    everything else byte-equal, and the card shows the calibration."""
    from safetensors.torch import load_file

    out, _, _ = tiny
    trained = load_file(out / "distill" / "run" / "final" / "model.safetensors")
    exported = load_file(out / "export" / "draft" / "model.safetensors")
    calib = json.loads((out / "export" / "draft" / "confidence_calibration.json").read_text())
    t = calib["folded_temperature"]
    assert t > 0 and abs(t - 1.0) > 1e-3  # a fit that moved, so the check below can fail
    assert set(trained) == set(exported)
    head = {k for k in trained if k.startswith("confidence_head.proj.")}
    assert head, sorted(trained)[:20]
    for k in trained:
        if k in head:
            torch.testing.assert_close(
                exported[k].double() * t, trained[k].double(), rtol=1e-5, atol=1e-7
            )
        else:
            assert torch.equal(exported[k], trained[k]), k
    assert "calibration/folded_temperature" in (out / "export" / "draft" / "README.md").read_text()


def test_dev_and_test_prompts_are_disjoint_from_training(tiny):
    out, _, _ = tiny
    prompts = out / "prompts"
    train = {t for row in _rows(prompts / "train.jsonl") for t in _user_texts(row)}
    dev = [
        t
        for d in ("chat", "code")
        for row in _rows(prompts / f"dev.{d}.jsonl")
        for t in _user_texts(row)
    ]
    test = [
        t
        for d in ("chat", "code")
        for row in _rows(prompts / f"test.{d}.jsonl")
        for t in _user_texts(row)
    ]
    assert dev and test
    for t in dev + test:  # naive: every pair compared
        assert all(t != u for u in train)
    assert all(t != u for t in test for u in dev)
    report = json.loads((prompts / "report.json").read_text())
    # the sources repeat 30 user turns under new ids: some must have been dropped
    assert sum(sum(report["overlap"][s]["dropped"].values()) for s in ("dev.chat", "test.chat")) > 0
    assert report["rows"]["test.code"] >= 6  # HumanEval's tasks first
    ids = [r["id"] for r in _rows(prompts / "test.code.jsonl")]
    assert ids[:6] == [f"HumanEval/{i}" for i in range(6)]


def test_rerun_skips_every_done_stage(tiny):
    out, src, _ = tiny
    log = _run(out, src)
    assert [f"[recipe] {s}: skip" in log for s in STAGES] == [True] * len(STAGES), log


def test_a_finished_run_moved_without_its_checkpoints_stays_done(tiny, tmp_path):
    # distill's checkpoints (optimizer state, to continue an unfinished run) are scratch: a user
    # deletes them or leaves them behind, and no stage reruns
    out, src, _ = tiny
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    assert any((copy / "distill" / "run" / "checkpoints").iterdir())
    shutil.rmtree(copy / "distill" / "run" / "checkpoints")
    log = _run(copy, src)
    assert [f"[recipe] {s}: skip" in log for s in STAGES] == [True] * len(STAGES), log


def test_from_and_until_select_stages(tiny):
    out, src, _ = tiny
    log = _run(out, src, "--from", "prompts", "--until", "prompts")
    assert "[recipe] target: skip (before --from prompts)" in log
    assert "[recipe] prompts: start (rerun from --from)" in log
    assert "regenerate" not in log
    # the prompts came out byte for byte the same: nothing later is invalidated
    log = _run(out, src, "--until", "distill")
    assert all(f"[recipe] {s}: skip" in log for s in ("regenerate", "distill")), log
    assert "evaluate" not in log


def test_a_changed_setting_invalidates_the_later_stages(tiny, tmp_path):
    out, src, _ = tiny
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    log = _run(copy, src, "--until", "prompts", "prompts.chat.train_rows=20")
    assert "[recipe] prompts: start (its inputs or settings changed)" in log
    log = _run(copy, src, "--from", "distill", "prompts.chat.train_rows=20", code=2)
    assert "distill: cannot run: regenerate not done (its inputs or settings changed)" in log


def test_a_killed_stage_continues_on_rerun(tiny, tmp_path):
    out, src, _ = tiny
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "regenerate")  # so the poll below sees only the new run's rows
    small = ["regenerate.batch_size=4", "regenerate.max_new_tokens=32"]  # 10 chunks of 4 rows
    proc = subprocess.Popen(
        _cmd(copy, src, "--until", "regenerate", *small),
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    rows = copy / "regenerate" / "train.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if rows.is_file() and len(rows.read_text().splitlines()) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "regenerate ended before the kill"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = rows.read_text().splitlines()
    total = len(_rows(copy / "prompts" / "train.jsonl"))
    assert 2 <= len(before) < total
    log = _run(copy, src, "--until", "regenerate", *small)
    assert "[recipe] regenerate: start (continuing an unfinished run)" in log
    after = rows.read_text().splitlines()
    assert after[: len(before)] == before and len(after) == total
    summary = json.loads((copy / "regenerate" / "train.jsonl.summary.json").read_text())
    assert summary["written_this_run"] == total - len(before)


def test_bad_recipe_name_and_key_exit_2(capsys):
    assert recipe.main(["no-such-recipe"]) == 2
    err = capsys.readouterr().err
    assert (
        "unknown recipe 'no-such-recipe'" in err
        and "tiny" in err
        and "qwen2.5-coder-1.5b-instruct" in err
    )
    assert recipe.main(["tiny", "prompts.chat.no_such_key=1"]) == 2
    assert "no_such_key" in capsys.readouterr().err
    assert recipe.main(["tiny", "regenerate.backend=gpu"]) == 2
    assert "regenerate.backend" in capsys.readouterr().err
