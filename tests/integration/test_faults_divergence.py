"""Fault injection in the training loop: a NaN loss or gradient at step k stops the run naming the
step and the rows, keeps the state before k as LAST_GOOD, and resume continues exactly; with
trainer.max_bad_batches the bad batch is skipped instead (no update, counted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.integration.test_distill import _train_losses, fast
from train.distill import main
from train.loop import trainer as trainer_mod
from train.loop.objective import DistillObjective
from train.loop.state import LAST_GOOD_NAME, latest_checkpoint

STEPS = ["trainer.max_steps=6", "trainer.eval_every=0"]
BAD_STEP = 4


@pytest.fixture(scope="module")
def reference_run(target, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main(fast(target, out, *STEPS)) == 0
    return out


@pytest.fixture(scope="module")
def reference(reference_run) -> list:
    return _train_losses(reference_run)


def test_export_records_the_acceptance_the_serving_watchdog_expects(reference_run):
    from common.target_fit import TOKENIZER_HASH_KEY
    from serve.watchdog import expected_acceptance

    prov = json.loads((reference_run / "final" / "provenance.json").read_text())
    rec = prov["expected_acceptance"]
    assert rec["source"] == "held-out evaluation"
    assert rec["per_position"] == prov["final_metrics"]["acceptance_per_pos"]
    assert expected_acceptance(reference_run / "final") == rec["per_position"]
    assert len(prov[TOKENIZER_HASH_KEY]) == 16


def poison(monkeypatch, at_call: int, where: str) -> dict:
    """Make the `at_call`-th training forward (1-based) non-finite: its loss (`where="loss"`) or
    only its gradient (`where="grad"`, the loss stays finite). Records that batch and the
    trainer."""
    seen = {"calls": 0}
    forward = DistillObjective.forward

    def poisoned(self, *args):
        loss, sums = forward(self, *args)
        if self.training:
            seen["calls"] += 1
            if seen["calls"] == at_call:
                seen["input_ids"] = args[3]["input_ids"].clone()
                if where == "loss":
                    loss = loss * float("nan")
                else:
                    loss.register_hook(lambda g: g * float("inf"))
        return loss, sums

    init = trainer_mod.Trainer.__init__

    def keep(self, *a, **k):
        init(self, *a, **k)
        seen["trainer"] = self

    monkeypatch.setattr(DistillObjective, "forward", poisoned)
    monkeypatch.setattr(trainer_mod.Trainer, "__init__", keep)
    return seen


def _named_rows(message: str) -> list[int]:
    start = message.index("training rows [") + len("training rows ")
    return json.loads(message[start : message.index("]", start) + 1])


@pytest.mark.parametrize("where", ["loss", "grad"])
def test_nan_at_step_k_stops_naming_rows_and_resume_is_exact(
    target, reference, tmp_path, monkeypatch, capsys, where
):
    out = tmp_path / "run"
    seen = poison(monkeypatch, BAD_STEP, where)
    assert main(fast(target, out, *STEPS)) == 2
    err = capsys.readouterr().err
    assert f"training diverged at step {BAD_STEP}" in err
    assert ("non-finite loss" if where == "loss" else "non-finite gradient norm") in err
    rows = _named_rows(err)
    # The named rows are the poisoned batch: look them up in the training set independently.
    ds = seen["trainer"].train_ds.with_format("torch", columns=["input_ids"])
    assert torch.equal(ds[rows]["input_ids"].long(), seen["input_ids"].cpu())
    # The state after step k-1 is kept and marked; nothing later was written.
    kept = out / "checkpoints" / f"step-{BAD_STEP - 1:06d}"
    assert (out / "checkpoints" / LAST_GOOD_NAME).read_text().strip() == kept.name
    assert latest_checkpoint(out) == kept and str(kept) in err
    assert not (out / "final").exists()
    assert [s for s, _ in _train_losses(out)] == list(range(1, BAD_STEP))
    monkeypatch.undo()
    assert main(fast(target, out, *STEPS, "resume=true")) == 0
    assert _train_losses(out) == reference


def test_bad_batch_is_skipped_within_the_allowance(target, reference, tmp_path, monkeypatch):
    out = tmp_path / "skip"
    seen = poison(monkeypatch, BAD_STEP, "loss")
    assert main(fast(target, out, *STEPS, "trainer.max_bad_batches=1")) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    skips = [r for r in recs if r["split"] == "skip"]
    assert len(skips) == 1 and skips[0]["bad_batches"] == 1 and skips[0]["step"] == BAD_STEP - 1
    ds = seen["trainer"].train_ds.with_format("torch", columns=["input_ids"])
    assert torch.equal(ds[skips[0]["rows"]]["input_ids"].long(), seen["input_ids"].cpu())
    train = [r for r in recs if r["split"] == "train"]
    # Every one of the 6 optimizer steps happened; before the bad batch nothing changed, after it
    # the run sees other batches (the bad one was dropped, not retried) and counts it.
    assert [r["step"] for r in train] == list(range(1, 7))
    assert _train_losses(out)[: BAD_STEP - 1] == reference[: BAD_STEP - 1]
    assert _train_losses(out)[BAD_STEP - 1] != reference[BAD_STEP - 1]
    assert [r["bad_batches"] for r in train] == [0] * (BAD_STEP - 1) + [1] * (7 - BAD_STEP)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in train)


def test_negative_max_bad_batches_is_refused(target, tmp_path, capsys):
    assert main(fast(target, tmp_path / "o", *STEPS, "trainer.max_bad_batches=-1")) == 2
    assert "trainer.max_bad_batches" in capsys.readouterr().err


def test_nan_in_the_target_states_stops_at_that_step(target, tmp_path, monkeypatch, capsys):
    """The target's finite check is read with the step's other flags (no host sync of its own):
    a NaN hidden state still stops the run at that step, before any update, naming the target."""
    seen = {"step": None}
    step, capture = trainer_mod.Trainer.train_step, trainer_mod.capture_batch

    def counted(self):
        seen["step"] = self.step + 1
        try:
            return step(self)
        finally:
            seen["step"] = None

    def poisoned(cap, batch):
        out = capture(cap, batch)
        if seen["step"] == BAD_STEP:
            out.final = out.final * float("nan")
        return out

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", counted)
    monkeypatch.setattr(trainer_mod, "capture_batch", poisoned)
    out = tmp_path / "run"
    assert main(fast(target, out, *STEPS)) == 2
    assert "NaN/Inf in the target's hidden states" in capsys.readouterr().err
    assert [s for s, _ in _train_losses(out)] == list(range(1, BAD_STEP))


def test_every_step_trains_on_the_anchors_of_its_step(target, tmp_path, monkeypatch):
    """The next step's batches and anchors are drawn while a step runs; a skipped batch leaves
    the step count where it was, so the batches drawn after it are anchored again: every forward
    trains on the anchors a step-by-step run keys to the step it belongs to."""
    from train.loop.anchors import sample_anchors

    seen = poison(monkeypatch, BAD_STEP, "loss")
    records = []
    forward = DistillObjective.forward

    def record(self, *args):
        if self.training:
            batch = {k: v.clone() for k, v in args[3].items()}
            records.append((seen["trainer"].step, batch, args[4].clone(), args[5].clone()))
        return forward(self, *args)

    monkeypatch.setattr(DistillObjective, "forward", record)
    assert main(fast(target, tmp_path / "run", *STEPS, "trainer.max_bad_batches=1")) == 0
    cfg = seen["trainer"].cfg
    steps = [s for s, *_ in records]
    # 7 forwards for 6 steps: the skipped batch and the one after it share a step count.
    assert steps == list(range(BAD_STEP)) + list(range(BAD_STEP - 1, 6))
    for step, batch, anchors, valid in records:
        want_anchors, want_valid = sample_anchors(
            batch["loss_mask"],
            cfg.trainer.num_anchors,
            cfg.seed,
            step,
            batch["input_ids"],
            batch.get("doc_ids"),
        )
        assert torch.equal(anchors, want_anchors) and torch.equal(valid, want_valid)
