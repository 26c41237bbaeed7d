"""Write faults: an OSError at each write call of a training checkpoint or an export, a kill -9 at
each write call of a checkpoint, and a disk too small for the next save. The previous checkpoint
and the earlier export must stay intact and loadable, and a resume after the fault exact."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import other as accelerate_io

import common.checkpoint as ckpt_io
from common.checkpoint import NoSpaceForSave, save_checkpoint
from common.contract import check_checkpoint
from tests.conftest import tiny_model
from tests.test_distill import _train_losses, fast
from tests.tiny_assets import build_tiny_random_target
from train.distill import main
from train.model_card import write_model_card
from train.state import (
    LAST_GOOD_NAME,
    latest_checkpoint,
    load_checkpoint_state,
    save_checkpoint_state,
)

pytestmark = pytest.mark.usefixtures("torch_single_thread")
FINGERPRINT = {"run": "faults"}


class Faults:
    """Wraps every function a save writes through; `fail_at=i` raises OSError at the i-th call
    (0-based), `pause_at=i` writes `marker` and sleeps there instead (for a kill -9)."""

    def __init__(self, monkeypatch, targets, fail_at=None, pause_at=None, marker=None):
        self.calls: list[str] = []
        self.fail_at, self.pause_at, self.marker = fail_at, pause_at, marker
        for owner, name in targets:
            real = getattr(owner, name)
            monkeypatch.setattr(owner, name, self._wrap(f"{name}", real))

    def _wrap(self, label, real):
        def wrapped(*args, **kwargs):
            i = len(self.calls)
            self.calls.append(label)
            if i == self.fail_at:
                raise OSError(28, f"injected: no space left on device at {label}")
            if i == self.pause_at:
                Path(self.marker).write_bytes(label.encode())  # not via the wrapped write_text
                time.sleep(60)
            return real(*args, **kwargs)

        return wrapped


TRAIN_WRITES = [
    (accelerate_io, "safe_save_file"),
    (torch, "save"),
    (pathlib.Path, "write_text"),
    (pathlib.Path, "rename"),
    (os, "replace"),
    (ckpt_io, "_exchange_dirs"),
]
EXPORT_WRITES = [
    (ckpt_io, "save_file"),
    (pathlib.Path, "write_text"),
    (pathlib.Path, "chmod"),
    (pathlib.Path, "rename"),
    (os, "replace"),
    (ckpt_io, "_exchange_dirs"),
]


def _train_setup():
    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def _train_one_step(model, opt):
    model(torch.randn(4, 8)).square().sum().backward()
    opt.step()
    opt.zero_grad()


def _snapshot(model, opt):
    return {k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict()["state"][0][
        "exp_avg"
    ].clone()


def _assert_loads_as(out: Path, expected_ckpt: Path, snap):
    assert latest_checkpoint(out) == expected_ckpt
    acc, model, opt = _train_setup()
    _train_one_step(model, opt)  # different weights and optimizer state before loading
    state = load_checkpoint_state(acc, expected_ckpt, FINGERPRINT)
    assert state["step"] == 1
    weights, exp_avg = snap
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], exp_avg)


def _count_writes(monkeypatch, targets, action) -> list[str]:
    with monkeypatch.context() as m:
        faults = Faults(m, targets)
        action()
    return faults.calls


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("resave_same_step", [False, True])
def test_checkpoint_write_fault_at_each_call_keeps_the_previous(
    tmp_path, monkeypatch, resave_same_step
):
    acc, model, opt = _train_setup()
    _train_one_step(model, opt)
    out = tmp_path / "run"
    first = save_checkpoint_state(acc, out, 1, {"fingerprint": FINGERPRINT}, keep_last=2)
    snap = _snapshot(model, opt)
    _train_one_step(model, opt)
    step = 1 if resave_same_step else 2
    probe = tmp_path / "probe"
    shutil.copytree(out, probe)
    calls = _count_writes(
        monkeypatch,
        TRAIN_WRITES,
        lambda: save_checkpoint_state(acc, probe, step, {"fingerprint": FINGERPRINT}, 2),
    )
    assert len(calls) >= 5, calls  # model, optimizer, scheduler-free RNG, state json, rename
    # Up to and including the move into place the old checkpoint must survive; a fault after it
    # (the LAST_GOOD marker, rotation) leaves the new, complete one, also a good outcome.
    publish = max(i for i, c in enumerate(calls) if c in ("rename", "_exchange_dirs"))
    base = tmp_path / "base"
    shutil.copytree(out, base)
    for i in range(len(calls)):
        shutil.rmtree(out)
        shutil.copytree(base, out)
        with monkeypatch.context() as m:
            Faults(m, TRAIN_WRITES, fail_at=i)
            with pytest.raises(OSError, match="injected"):
                save_checkpoint_state(acc, out, step, {"fingerprint": FINGERPRINT}, 2)
        assert _leftovers(out / "checkpoints") == [], (i, calls[i])
        if i <= publish:
            _assert_loads_as(out, first, snap)
        else:
            assert (out / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").exists()
            assert latest_checkpoint(out) is not None


def test_kill_9_at_each_write_call_keeps_the_previous(tmp_path, monkeypatch):
    """A forked child saves step 2 and is SIGKILLed while paused inside each write call in turn."""
    acc, model, opt = _train_setup()
    _train_one_step(model, opt)
    out = tmp_path / "run"
    first = save_checkpoint_state(acc, out, 1, {"fingerprint": FINGERPRINT}, keep_last=2)
    snap = _snapshot(model, opt)
    _train_one_step(model, opt)
    probe = tmp_path / "probe"
    shutil.copytree(out, probe)
    calls = _count_writes(
        monkeypatch,
        TRAIN_WRITES,
        lambda: save_checkpoint_state(acc, probe, 2, {"fingerprint": FINGERPRINT}, 2),
    )
    publish = max(i for i, c in enumerate(calls) if c in ("rename", "_exchange_dirs"))
    for i in range(publish + 1):
        marker = tmp_path / f"paused-{i}"
        pid = os.fork()
        if pid == 0:  # child: never returns into pytest
            try:
                Faults(monkeypatch, TRAIN_WRITES, pause_at=i, marker=marker)
                save_checkpoint_state(acc, out, 2, {"fingerprint": FINGERPRINT}, 2)
            finally:
                os._exit(0)
        deadline = time.time() + 60
        while not marker.exists():
            assert time.time() < deadline, f"child never reached write call {i} ({calls[i]})"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _assert_loads_as(out, first, snap)
    # The next save after all those kills completes and becomes LAST_GOOD.
    second = save_checkpoint_state(acc, out, 2, {"fingerprint": FINGERPRINT}, 2)
    assert latest_checkpoint(out) == second and _leftovers(out / "checkpoints") == []


def _card(tmp):
    write_model_card(
        tmp,
        target="tiny",
        recipe={"steps": 1},
        metrics={"analytic_tau": 2.0},
        per_position_acceptance=[0.5, 0.4, 0.3, 0.2],
    )


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_export_write_fault_at_each_call_keeps_the_earlier_export(tmp_path, monkeypatch):
    out = save_checkpoint(tiny_model(seed=1), tmp_path / "final", before_publish=_card)
    before = _files(out)
    assert "README.md" in before and check_checkpoint(out) == []
    newer = tiny_model(seed=2)
    probe = tmp_path / "probe" / "final"
    shutil.copytree(out, probe)
    calls = _count_writes(
        monkeypatch,
        EXPORT_WRITES,
        lambda: save_checkpoint(newer, probe, before_publish=_card),
    )
    assert len(calls) >= 6, calls
    for i in range(len(calls)):
        with monkeypatch.context() as m:
            Faults(m, EXPORT_WRITES, fail_at=i)
            with pytest.raises(OSError, match="injected"):
                save_checkpoint(newer, out, before_publish=_card)
        assert _files(out) == before, (i, calls[i])
        assert check_checkpoint(out) == []
        assert _leftovers(tmp_path) == [], (i, calls[i])
    save_checkpoint(newer, out, before_publish=_card)  # and without a fault it does replace it
    assert _files(out) != before and check_checkpoint(out) == []


def test_a_save_that_cannot_fit_is_refused_with_the_sizes(tmp_path, monkeypatch):
    acc, model, opt = _train_setup()
    _train_one_step(model, opt)
    out = tmp_path / "run"
    first = save_checkpoint_state(acc, out, 1, {"fingerprint": FINGERPRINT}, keep_last=2)
    export = save_checkpoint(tiny_model(seed=1), tmp_path / "final")
    before = _files(export)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, (1 << 30) - 4096, 4096))
    with pytest.raises(NoSpaceForSave, match=r"needs about [\d.]+ MiB .* has 0\.0 MiB free"):
        save_checkpoint_state(acc, out, 2, {"fingerprint": FINGERPRINT}, keep_last=2)
    with pytest.raises(NoSpaceForSave, match=r"checkpoint .*final.* needs about"):
        save_checkpoint(tiny_model(seed=2), export)
    assert latest_checkpoint(out) == first and _leftovers(out / "checkpoints") == []
    assert _files(export) == before and _leftovers(tmp_path) == []
    # Negative control: with room to spare the same saves go through.
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 40, 0, 1 << 40))
    save_checkpoint_state(acc, out, 2, {"fingerprint": FINGERPRINT}, keep_last=2)
    assert (out / "checkpoints" / LAST_GOOD_NAME).read_text().strip() == "step-000002"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return build_tiny_random_target(tmp_path_factory.mktemp("target") / "t")


def test_resume_after_a_failed_checkpoint_write_is_exact(target, tmp_path, monkeypatch):
    steps = ["trainer.max_steps=6", "trainer.save_every=2", "trainer.eval_every=0"]
    ref = tmp_path / "ref"
    assert main(fast(target, ref, *steps)) == 0
    out = tmp_path / "faulty"
    with monkeypatch.context() as m:
        # Model weights are written first in each save: call 0 is step 2's, call 1 step 4's.
        Faults(m, [(accelerate_io, "safe_save_file")], fail_at=1)
        with pytest.raises(OSError, match="injected"):
            main(fast(target, out, *steps))
    assert latest_checkpoint(out).name == "step-000002"
    assert _leftovers(out / "checkpoints") == []
    assert main(fast(target, out, *steps, "resume=true")) == 0
    assert _train_losses(out) == _train_losses(ref)
