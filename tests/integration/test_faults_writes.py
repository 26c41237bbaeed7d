"""Write faults: an OSError at each write call of a training checkpoint or an export, a kill -9
midway through each write call of a checkpoint save (LAST_GOOD and rotation included) and of an
export, a training run killed midway through a save or an export and then resumed, and a disk too
small for the next save. The previous checkpoint and the earlier export must stay intact and
loadable, and a resume after the fault exact."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
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
from tests.integration.test_distill import _train_losses, fast
from train.distill import main
from train.loop.state import (
    LAST_GOOD_NAME,
    STATE_NAME,
    clear_leftovers,
    latest_checkpoint,
    load_checkpoint_state,
    save_checkpoint_state,
)
from train.publish.model_card import write_model_card

pytestmark = pytest.mark.usefixtures("torch_single_thread")
FINGERPRINT = {"run": "faults"}


class Faults:
    """Wraps every function a save writes through; `fail_at=i` raises OSError at the i-th call
    (0-based); `kill_at` leaves what a kill -9 in the middle of a call leaves on disk and SIGKILLs
    the process itself there (`_die_partway`): at the i-th call, or with `(label, part, n)` at the
    n-th call of `label` on a path containing `part`."""

    def __init__(self, monkeypatch, targets, fail_at=None, kill_at=None):
        self.calls: list[str] = []
        self.paths: list[str] = []
        self.fail_at, self.kill_at = fail_at, kill_at
        self._matches = 0
        for owner, name in targets:
            real = getattr(owner, name)
            monkeypatch.setattr(owner, name, self._wrap(f"{name}", real))

    def _wrap(self, label, real):
        def wrapped(*args, **kwargs):
            i = len(self.calls)
            self.calls.append(label)
            self.paths.append(str(_written_path(label, args)))
            if i == self.fail_at:
                raise OSError(28, f"injected: no space left on device at {label}")
            if self._kill_here(i, label):
                _die_partway(label, real, args, kwargs)
            return real(*args, **kwargs)

        return wrapped

    def _kill_here(self, i: int, label: str) -> bool:
        if not isinstance(self.kill_at, tuple):
            return i == self.kill_at
        want, part, n = self.kill_at
        if label != want or part not in self.paths[-1]:
            return False
        self._matches += 1
        return self._matches == n + 1


# The file or folder each wrapped call writes, renames or deletes (first for methods of Path).
FILE_WRITERS = {"safe_save_file": 1, "save": 1, "save_file": 1, "write_text": 0}


def _written_path(label, args):
    return args[FILE_WRITERS.get(label, 0)] if args else None


def _die_partway(label, real, args, kwargs):
    """The state a kill -9 in the middle of this call leaves, then the kill. A file write leaves
    the first half of the file's bytes (written in full, then cut: the same bytes on disk as a
    process killed halfway through writing them); a recursive delete leaves half of the files;
    a rename, replace, exchange or chmod is one system call, so the kill lands just before it
    (the state just after it is the state before the next call)."""
    if label in FILE_WRITERS and isinstance(path := _written_path(label, args), (str, Path)):
        real(*args, **kwargs)
        with open(path, "r+b") as f:
            f.truncate(Path(path).stat().st_size // 2)
    elif label == "rmtree" and Path(args[0]).is_dir():
        files = sorted(p for p in Path(args[0]).rglob("*") if p.is_file())
        for f in files[: (len(files) + 1) // 2]:
            f.unlink()
    os.kill(os.getpid(), signal.SIGKILL)


def _killed_child(run) -> None:
    """Run `run()` in a forked child, which must die of SIGKILL at its injected kill point."""
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            run()
        finally:
            os._exit(3)  # reached only when the kill point never came
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


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
    assert state["step"] == int(expected_ckpt.name.removeprefix("step-"))
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


KILL_TRAIN_WRITES = [*TRAIN_WRITES, (shutil, "rmtree")]


def test_kill_9_midway_through_each_write_call_keeps_a_checkpoint(tmp_path, monkeypatch):
    """A forked child saves step 3 (rotating step 1 out, keep_last=2) and is SIGKILLed midway
    through each write call in turn: weights, optimizer and RNG files and the state JSON half
    written, the LAST_GOOD temp file half written, just before each rename, halfway through
    deleting the rotated checkpoint. Until LAST_GOOD names step 3 the checkpoint resumed from is
    step 2, after that step 3, each loading exactly. The next save clears what the kill left, and a
    later rotation of the same step name (an overwrite=true run into the folder) goes through."""
    acc, model, opt = _train_setup()
    out, snaps = tmp_path / "run", {}
    for step in (1, 2):
        _train_one_step(model, opt)
        save_checkpoint_state(acc, out, step, {"fingerprint": FINGERPRINT}, keep_last=2)
        snaps[step] = _snapshot(model, opt)
    _train_one_step(model, opt)
    snaps[3] = _snapshot(model, opt)
    ckpts = {s: out / "checkpoints" / f"step-{s:06d}" for s in (1, 2, 3)}

    def save(step):
        return save_checkpoint_state(acc, out, step, {"fingerprint": FINGERPRINT}, keep_last=2)

    base = tmp_path / "base"
    shutil.copytree(out, base)
    calls = _count_writes(monkeypatch, KILL_TRAIN_WRITES, lambda: save(3))
    assert calls[-2:] == ["rename", "rmtree"], calls  # the rotation of step 1
    marked = calls.index("replace")  # os.replace of the LAST_GOOD temp file
    for i in range(len(calls)):
        shutil.rmtree(out)
        shutil.copytree(base, out)

        def killed_save(i=i):
            Faults(monkeypatch, KILL_TRAIN_WRITES, kill_at=i)
            save(3)

        _killed_child(killed_save)
        resumed = 3 if i > marked else 2
        _assert_loads_as(out, ckpts[resumed], snaps[resumed])
        assert save(3) == latest_checkpoint(out) == ckpts[3], (i, calls[i])
        assert _leftovers(out / "checkpoints") == [], (i, calls[i])
        save(1)  # as a fresh overwrite=true run would, then rotate step 1 out again
        assert save(2) == latest_checkpoint(out) and not ckpts[1].exists(), (i, calls[i])
        assert _leftovers(out / "checkpoints") == [], (i, calls[i])


def _card(tmp):
    write_model_card(
        tmp,
        target="tiny",
        recipe={"steps": 1},
        metrics={"analytic_tau": 2.0},
        per_position_acceptance=[0.5, 0.4, 0.3, 0.2],
        local_path=tmp.parent / "final",  # as train.publish.export passes it: the card names final/
    )


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _export_over_an_earlier_one(tmp_path, monkeypatch, writes):
    """An earlier export `final/`, a newer draft, and the write calls an export of it makes
    (counted on a copy, `probe/final`): (final, its files, newer draft, probe, calls)."""
    out = save_checkpoint(tiny_model(seed=1), tmp_path / "final", before_publish=_card)
    before = _files(out)
    assert "README.md" in before and check_checkpoint(out) == []
    newer = tiny_model(seed=2)
    probe = tmp_path / "probe" / "final"
    shutil.copytree(out, probe)
    calls = _count_writes(
        monkeypatch, writes, lambda: save_checkpoint(newer, probe, before_publish=_card)
    )
    return out, before, newer, probe, calls


def test_export_write_fault_at_each_call_keeps_the_earlier_export(tmp_path, monkeypatch):
    out, before, newer, probe, calls = _export_over_an_earlier_one(
        tmp_path, monkeypatch, EXPORT_WRITES
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


KILL_EXPORT_WRITES = [*EXPORT_WRITES, (shutil, "rmtree")]


def test_kill_9_midway_through_each_export_write_keeps_an_export(tmp_path, monkeypatch):
    """A forked child exports over an earlier `final/` and is SIGKILLed midway through each write
    call (weights, config, provenance and card half written, before each chmod and rename, halfway
    through deleting the replaced export): `final/` is the earlier export until the atomic swap and
    the new one after it, contract-clean either way. What the kill left beside it is removed by the
    next export (`train.publish.export` clears it first) and is never a folder a loader would pick
    up."""
    out, before, newer, probe, calls = _export_over_an_earlier_one(
        tmp_path, monkeypatch, KILL_EXPORT_WRITES
    )
    after = _files(probe)
    del after["README.md"]  # it names the folder's path, probe/final there
    swapped = calls.index("_exchange_dirs")
    assert calls[swapped + 1 :] == ["rmtree"], calls  # the swap is the last step bar the delete
    base = tmp_path / "probe" / "base"
    shutil.copytree(out, base)
    for i in range(len(calls)):
        shutil.rmtree(out)
        shutil.copytree(base, out)

        def killed_export(i=i):
            Faults(monkeypatch, KILL_EXPORT_WRITES, kill_at=i)
            save_checkpoint(newer, out, before_publish=_card)

        _killed_child(killed_export)
        assert check_checkpoint(out) == [], (i, calls[i])
        now = _files(out)
        if i > swapped:
            assert {k: v for k, v in now.items() if k != "README.md"} == after, (i, calls[i])
        else:
            assert now == before, (i, calls[i])
        assert _leftovers(tmp_path), (i, calls[i])  # the temp folder, new or holding the old
        clear_leftovers(tmp_path, (".final.tmp-*", ".final.old-*"))
        assert _leftovers(tmp_path) == [] and check_checkpoint(out) == [], (i, calls[i])


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


# Everything a training run writes through, checkpoints and exports alike.
RUN_WRITES = list(dict.fromkeys([*TRAIN_WRITES, *EXPORT_WRITES, (shutil, "rmtree")]))
# Saves at steps 2, 4 and 6 (the last one rotates step 2 out, keep_last=2), then final/ and
# final-speculators/.
RUN = ["trainer.max_steps=6", "trainer.save_every=2", "trainer.eval_every=0"]
# (call, part of the path it writes, n-th such call): a kill -9 midway through it.
KILL_POINTS = {
    "step4-weights-half-written": ("safe_save_file", "step-000004", 0),
    "step4-optimizer-half-written": ("save", "step-000004/optimizer", 0),
    "step4-state-json-half-written": ("write_text", "step-000004/trainer_state", 0),
    "step4-LAST_GOOD-half-written": ("write_text", ".LAST_GOOD.tmp-", 1),
    "step4-in-place-LAST_GOOD-not-yet": ("replace", ".LAST_GOOD.tmp-", 1),
    "rotated-step2-half-deleted": ("rmtree", ".old-step-000002", 0),
    "final-weights-half-written": ("save_file", ".final.tmp-", 0),
    "final-speculators-card-half-written": ("write_text", ".final-speculators.tmp-", 2),
}


@pytest.fixture(scope="module")
def reference(target, tmp_path_factory):
    """An uninterrupted run, and the write calls it made under its output folder (label, path)."""
    ref = tmp_path_factory.mktemp("reference") / "run"
    with pytest.MonkeyPatch.context() as m:
        faults = Faults(m, RUN_WRITES)
        assert main(fast(target, ref, *RUN)) == 0
    calls = [(c, p) for c, p in zip(faults.calls, faults.paths) if p.startswith(str(ref))]
    return ref, calls


def _run_killed(target, out: Path, kill_at, monkeypatch, *extra: str) -> None:
    def killed_run():
        Faults(monkeypatch, RUN_WRITES, kill_at=kill_at)
        main(fast(target, out, *RUN, *extra))

    _killed_child(killed_run)
    ckpt = latest_checkpoint(out)
    assert ckpt is None or json.loads((ckpt / STATE_NAME).read_text())["step"] in (2, 4, 6)


def _resume_is_exact(target, ref: Path, out: Path) -> None:
    # auto: a kill before the first save leaves nothing to resume (resume=true refuses that)
    assert main(fast(target, out, *RUN, "resume=auto")) == 0
    assert _train_losses(out) == _train_losses(ref)
    for d in ("final", "final-speculators"):
        assert check_checkpoint(out / d) == []
        weights = (out / d / "model.safetensors").read_bytes()
        assert weights == (ref / d / "model.safetensors").read_bytes(), d
    # Only distill's 2-byte write probe may stay (killed between writing and unlinking it): the
    # ranks of a DDP run probe the folder at once, so none may delete another's.
    assert [n for n in _leftovers(out) if not n.startswith(".write-test-")] == []
    assert _leftovers(out / "checkpoints") == []


def _kill_midway_then_resume(target, ref: Path, out: Path, kill_at, monkeypatch) -> None:
    _run_killed(target, out, kill_at, monkeypatch)
    _resume_is_exact(target, ref, out)


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_kill_9_midway_through_a_save_then_resume_is_exact(
    target, reference, tmp_path, monkeypatch, point
):
    """A training run SIGKILLed midway through a write of a checkpoint, of LAST_GOOD, of the
    rotation or of an export, then run again with resume=true: the same loss curve and the same
    exported weights as the uninterrupted run, and nothing left behind by the kill."""
    ref, calls = reference
    label, part, n = KILL_POINTS[point]
    assert sum(c == label and part in p for c, p in calls) > n, (point, calls)
    _kill_midway_then_resume(target, ref, tmp_path / "killed", KILL_POINTS[point], monkeypatch)


@pytest.mark.slow
def test_kill_9_midway_through_every_write_of_a_run_then_resume_is_exact(
    target, reference, tmp_path, monkeypatch
):
    """The same at every write call the run makes under its output folder, bar two kinds that
    repeat others (to keep the test near 30 s): the step-4 save's calls (the step-2 save makes the
    same ones, and four of them are in the fast test) and the chmods of an export's temp folder
    (killed before a chmod, the folder differs only in file modes from the call before)."""
    ref, calls = reference
    kills = [
        (i, label)
        for i, (label, path) in enumerate(calls)
        if label != "chmod" and "step-000004" not in path
    ]
    assert len(kills) >= 30, calls
    for i, label in kills:
        out = tmp_path / f"killed-{i}"
        n = sum(c == label for c, _ in calls[:i])
        _kill_midway_then_resume(target, ref, out, (label, str(out), n), monkeypatch)


def test_kill_9_while_a_resumed_run_rewrites_its_metrics_then_resume_is_exact(
    target, reference, tmp_path, monkeypatch
):
    """Killed midway through step 4's save, then again while the resumed run cuts metrics.jsonl
    back to step 2: a third run still reproduces the uninterrupted loss curve."""
    ref, _ = reference
    out = tmp_path / "killed"
    _run_killed(target, out, KILL_POINTS["step4-weights-half-written"], monkeypatch)
    _run_killed(target, out, ("write_text", "metrics.jsonl", 0), monkeypatch, "resume=true")
    _resume_is_exact(target, ref, out)
