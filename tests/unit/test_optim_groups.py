"""train/loop/optim_groups.py: which parameters learn at the Markov head's rate, and that the
schedule
keeps the ratio between the groups."""

from __future__ import annotations

import shutil

import pytest
import torch

from common.config import MARKOV_HEAD_TYPES
from tests.dist.tiny import tiny_model
from tests.integration.test_distill import _train_losses, fast
from train.config_io import BadConfig, compose_config
from train.distill import main
from train.loop.optim_groups import param_groups
from train.loop.schedule import make_schedule
from train.schema import OptimCfg


def test_the_head_is_found_inside_a_wrapping_module_by_identity():
    """As the trainer calls it: the objective wraps the draft; the head's parameters, and only
    they, form the second group."""
    draft = tiny_model()
    wrapper = torch.nn.ModuleDict({"draft": draft})
    rest, markov = param_groups(wrapper, draft.markov_head, 1e-3, 10.0)
    assert {id(p) for p in markov["params"]} == {id(p) for p in draft.markov_head.parameters()}
    assert not {id(p) for p in rest["params"]} & {id(p) for p in markov["params"]}


def test_scale_one_keeps_one_group_of_every_trainable_parameter():
    model = tiny_model(markov_head_type="gated")
    model.lm_head.weight.requires_grad_(False)
    (group,) = param_groups(model, model.markov_head, 1e-3, 1.0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert group["lr"] == 1e-3
    assert [id(p) for p in group["params"]] == [id(p) for p in trainable]


@pytest.mark.parametrize("head", MARKOV_HEAD_TYPES)
def test_the_markov_head_gets_its_own_rate(head):
    model = tiny_model(markov_head_type=head)
    rest, markov = param_groups(model, model.markov_head, 2e-4, 10.0)
    assert rest["lr"] == 2e-4 and markov["lr"] == pytest.approx(2e-3)
    expected = {id(p) for p in model.markov_head.parameters()}
    assert {id(p) for p in markov["params"]} == expected
    everything = [id(p) for p in rest["params"] + markov["params"]]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert sorted(everything) == sorted(trainable)


def test_a_draft_without_markov_head_has_one_group():
    model = tiny_model(markov_rank=0, confidence=False)
    assert model.markov_head is None
    assert len(param_groups(model, model.markov_head, 1e-3, 10.0)) == 1


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan")])
def test_a_scale_that_is_not_positive_is_refused(scale):
    with pytest.raises(ValueError, match="markov_lr_scale"):
        model = tiny_model()
        param_groups(model, model.markov_head, 1e-3, scale)


def test_the_schedule_scales_both_groups_alike():
    model = tiny_model()
    opt = torch.optim.AdamW(param_groups(model, model.markov_head, 1e-3, 10.0))
    cfg = OptimCfg(schedule="wsd", warmup_ratio=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, make_schedule(cfg, 20))
    for _ in range(20):
        rest, markov = (g["lr"] for g in opt.param_groups)
        assert markov == pytest.approx(10.0 * rest)
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] < 1e-3  # the decay ran


def test_one_step_moves_the_markov_head_ten_times_as_far():
    """AdamW's first step moves each weight by lr * sign(grad) (bias-corrected m/sqrt(v)), so a
    group at ten times the rate moves ten times as far from the same gradient."""
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    groups = param_groups(model, model.markov_head, 1e-3, 10.0)
    opt = torch.optim.AdamW(groups, weight_decay=0.0, eps=1e-12)
    head = {id(p) for p in model.markov_head.parameters()}
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        step = (p.detach() - before[n]).abs().max().item()
        assert step == pytest.approx(1e-2 if id(p) in head else 1e-3, rel=1e-4), n


@pytest.mark.parametrize("bad", ["0.0", "-2", "nan"])
def test_the_config_loader_refuses_a_scale_that_is_not_positive(bad):
    with pytest.raises(BadConfig, match=r"optim\.markov_lr_scale"):
        compose_config([f"optim.markov_lr_scale={bad}", "data.train=rows.jsonl"])


def test_a_run_with_the_head_at_ten_times_resumes_exactly_and_records_the_scale(target, tmp_path):
    """Two optimizer groups go through a checkpoint and back: a run resumed from its step-2
    checkpoint (the later one and the export removed) trains as the uninterrupted run did; the
    model card names the scale."""
    args = ("optim.markov_lr_scale=10", "trainer.save_every=2", "trainer.eval_every=0")
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert main(fast(target, ref, *args)) == 0
    assert main(fast(target, out, *args)) == 0
    shutil.rmtree(out / "checkpoints" / "step-000004")
    for name in ("final", "final-speculators"):
        shutil.rmtree(out / name)
    assert main(fast(target, out, *args, "resume=true")) == 0
    assert _train_losses(out) == _train_losses(ref)
    assert "markov_lr_scale" in (out / "final" / "README.md").read_text()


def test_a_weight_decay_of_its_own_splits_the_head_off_at_scale_one():
    model = tiny_model()
    rest, markov = param_groups(model, model.markov_head, 1e-3, 1.0, markov_weight_decay=0.5)
    assert markov["lr"] == rest["lr"] == 1e-3
    assert markov["weight_decay"] == 0.5 and "weight_decay" not in rest  # rest: AdamW's own
    assert {id(p) for p in markov["params"]} == {id(p) for p in model.markov_head.parameters()}


def test_the_heads_decay_shrinks_only_the_head():
    """With zero gradients, AdamW's step is the decoupled decay alone: p *= 1 - lr * wd, so the
    head shrinks by lr * scale * its decay and the rest keeps optim.weight_decay (0 here)."""
    model = tiny_model()
    with torch.no_grad():
        model.markov_head.markov_w2.weight.fill_(1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(
        param_groups(model, model.markov_head, 1e-3, 10.0, markov_weight_decay=0.5),
        weight_decay=0.0,
    )
    head = {id(p) for p in model.markov_head.parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        if p.requires_grad:
            factor = 1 - 1e-2 * 0.5 if id(p) in head else 1.0
            torch.testing.assert_close(p.detach(), before[n] * factor, rtol=0, atol=1e-7)


@pytest.mark.parametrize("bad", ["-0.1", "nan"])
def test_a_negative_head_decay_is_refused(bad):
    with pytest.raises(BadConfig, match=r"optim\.markov_weight_decay"):
        compose_config([f"optim.markov_weight_decay={bad}", "data.train=rows.jsonl"])
    model = tiny_model()
    with pytest.raises(ValueError, match="markov_weight_decay"):
        param_groups(model, model.markov_head, 1e-3, 1.0, markov_weight_decay=float(bad))
