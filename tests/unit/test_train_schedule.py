"""train/loop/schedule.py: the cosine and warmup-stable-decay schedules against float64
references, the
factory and its checks, the time-budget plan, the round trip through the scheduler's saved state,
and a time-boxed run that ends its schedule (either kind)."""

import json
import math
import re
import time
import types

import pytest
import torch

from tests.integration.test_distill import fast
from tests.slow_steps import slow_steps
from train.config_io import BadConfig, compose_config
from train.distill import main
from train.loop.schedule import (
    BUDGET_SHARE,
    RATE_SKIP_STEPS,
    RATE_STEPS,
    SCHEDULES,
    CosineSchedule,
    TimedHorizon,
    WSDSchedule,
    make_schedule,
    plan_horizon,
    steady_eval_seconds,
)
from train.schema import CHOICES, OptimCfg


def reference(step: int, warmup_ratio: float, min_ratio: float, horizon: int) -> float:
    warmup = max(1, round(warmup_ratio * horizon))
    if step < warmup:
        return (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, horizon - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def wsd_reference(
    warmup_ratio: float, decay_ratio: float, min_ratio: float, horizon: int, steps: int
) -> list[float]:
    """The WSD curve over steps 0..steps-1, built phase by phase from explicit boundaries."""
    warmup = max(1, round(warmup_ratio * horizon))
    decay_steps = max(1, round(decay_ratio * (horizon - warmup)))
    stable_end = horizon - decay_steps  # first step of the decay
    curve = []
    for step in range(steps):
        if step < warmup:
            curve.append((step + 1) / warmup)
        elif step < stable_end:
            curve.append(1.0)
        elif step < horizon:
            angle = math.pi * (step - stable_end) / decay_steps
            curve.append(1.0 - (1.0 - min_ratio) * (1.0 - math.cos(angle)) / 2.0)
        else:
            curve.append(min_ratio)
    return curve


def curve_reference(name: str, o: OptimCfg, horizon: int, steps: int) -> list[float]:
    if name == "wsd":
        return wsd_reference(o.warmup_ratio, o.decay_ratio, o.min_lr_ratio, horizon, steps)
    return [reference(k, o.warmup_ratio, o.min_lr_ratio, horizon) for k in range(steps)]


@pytest.mark.parametrize("horizon,warmup_ratio,min_ratio", [(100, 0.04, 0.0), (7, 0.3, 0.1)])
def test_cosine_schedule_matches_the_formula(horizon, warmup_ratio, min_ratio):
    s = CosineSchedule(warmup_ratio, min_ratio, horizon)
    for step in range(horizon + 3):  # past the horizon it stays at the floor
        want = reference(step, warmup_ratio, min_ratio, horizon)
        assert s(step) == pytest.approx(want, abs=1e-12)
    assert s(horizon + 2) == pytest.approx(min_ratio)


WSD_CASES = [  # horizon, warmup_ratio, decay_ratio, min_lr_ratio
    (1000, 0.04, 0.2, 0.0),
    (100, 0.04, 0.2, 0.1),
    (97, 0.1, 0.33, 0.05),
    (7, 0.3, 0.5, 0.1),
    (50, 0.0, 1.0, 0.0),  # no warm-up to speak of (one step), decay over all the rest
    (3, 0.5, 0.01, 0.2),  # a decay of under one step still takes one
    (1, 0.04, 0.2, 0.0),
]


@pytest.mark.parametrize("horizon,warmup_ratio,decay_ratio,min_ratio", WSD_CASES)
def test_wsd_schedule_matches_the_reference(horizon, warmup_ratio, decay_ratio, min_ratio):
    s = WSDSchedule(warmup_ratio, min_ratio, horizon, decay_ratio)
    want = wsd_reference(warmup_ratio, decay_ratio, min_ratio, horizon, horizon + 3)
    assert [s(k) for k in range(horizon + 3)] == pytest.approx(want, abs=1e-12)
    assert s(horizon) == s(horizon + 2) == pytest.approx(min_ratio)  # past the horizon: the floor


@pytest.mark.parametrize("horizon,warmup_ratio,decay_ratio,min_ratio", WSD_CASES)
def test_wsd_holds_exactly_one_between_warmup_and_decay(
    horizon, warmup_ratio, decay_ratio, min_ratio
):
    s = WSDSchedule(warmup_ratio, min_ratio, horizon, decay_ratio)
    warmup = max(1, round(warmup_ratio * horizon))
    start = horizon - max(1, round(decay_ratio * (horizon - warmup)))
    assert s(warmup - 1) == 1.0  # the warm-up ends at the peak
    assert all(s(k) == 1.0 for k in range(warmup, start))
    assert s(start) == pytest.approx(1.0, abs=1e-15)  # the decay starts from the peak
    if start + 1 < horizon:
        assert s(start + 1) < 1.0


def test_wsd_with_the_whole_rest_decaying_is_the_cosine():
    for horizon, warmup_ratio, min_ratio in [(100, 0.04, 0.0), (7, 0.3, 0.1), (333, 0.1, 0.05)]:
        wsd = WSDSchedule(warmup_ratio, min_ratio, horizon, decay_ratio=1.0)
        cos = CosineSchedule(warmup_ratio, min_ratio, horizon)
        assert [wsd(k) for k in range(horizon + 2)] == [cos(k) for k in range(horizon + 2)]


def test_a_replanned_horizon_moves_the_decay_to_the_new_end():
    s = WSDSchedule(0.04, 0.1, 1000, decay_ratio=0.2)
    assert s(599) == 1.0 and s(1000) == pytest.approx(0.1)
    s.horizon, s.planned = 300, True  # as Trainer._plan does
    want = wsd_reference(0.04, 0.2, 0.1, 300, 1001)
    assert [s(k) for k in range(1001)] == pytest.approx(want, abs=1e-12)
    # warm-up 12 steps, decay the last round(0.2 * 288) = 58: steps 242..299 from 1.0 to the floor
    assert s(242) == 1.0 and s(243) < 1.0 and s(300) == pytest.approx(0.1)


@pytest.mark.parametrize("name,cls", [("cosine", CosineSchedule), ("wsd", WSDSchedule)])
def test_make_schedule_builds_the_named_schedule(name, cls):
    o = OptimCfg(schedule=name, warmup_ratio=0.1, min_lr_ratio=0.05, decay_ratio=0.3)
    s = make_schedule(o, 200)
    assert type(s) is cls
    assert (s.horizon, s.planned) == (200, False)
    assert [s(k) for k in range(203)] == pytest.approx(curve_reference(name, o, 200, 203))


def test_the_schema_offers_exactly_the_schedules_there_are():
    assert CHOICES["optim.schedule"] == tuple(SCHEDULES)
    assert OptimCfg().schedule == "cosine"  # the default keeps the cosine
    cfg = compose_config(["+experiment=tiny", "data.train=rows.jsonl"])
    assert (cfg.optim.schedule, cfg.optim.decay_ratio) == ("cosine", 0.2)
    cfg = compose_config(["optim.schedule=wsd", "optim.decay_ratio=0.5", "data.train=rows.jsonl"])
    assert type(make_schedule(cfg.optim, 10)) is WSDSchedule


@pytest.mark.parametrize("bad", ["linear", "WSD", ""])
def test_an_unknown_schedule_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"optim\.schedule"):
        make_schedule(OptimCfg(schedule=bad), 100)
    with pytest.raises(BadConfig, match=r"optim\.schedule"):
        compose_config([f"optim.schedule={bad!r}", "data.train=rows.jsonl"])


@pytest.mark.parametrize("name", ["cosine", "wsd"])
@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_a_decay_ratio_outside_zero_one_is_refused_naming_the_field(name, bad):
    with pytest.raises(ValueError, match=r"optim\.decay_ratio"):
        make_schedule(OptimCfg(schedule=name, decay_ratio=bad), 100)


@pytest.mark.parametrize("bad", ["0.0", "1.5", "nan"])
def test_the_config_loader_refuses_a_bad_decay_ratio_before_any_work(bad):
    with pytest.raises(BadConfig, match=r"optim\.decay_ratio"):
        compose_config([f"optim.decay_ratio={bad}", "data.train=rows.jsonl"])


def test_plan_horizon_fits_the_rest_of_the_budget():
    # 40 s in of 100: 60 s * 0.97 = 58.2 s left at 0.5 s a step -> 116 more steps
    assert plan_horizon(22, 40.0, 100.0, 0.5, 1000) == 22 + math.floor(60 * BUDGET_SHARE / 0.5)
    assert plan_horizon(22, 40.0, 100.0, 0.5, 50) == 50  # never past max_steps
    assert plan_horizon(22, 120.0, 100.0, 0.5, 1000) == 22  # already over: stop here


def test_timed_horizon_measures_after_the_skipped_steps():
    t = TimedHorizon(budget_s=100.0, max_steps=10_000, start_step=5, overhead_per_step_s=0.1)
    seen = []
    for step in range(6, t.plan_step + 3):
        # steps before the window are slow (compiles): 10 s each; then 0.4 s each
        elapsed = 10.0 * min(step - 5, RATE_SKIP_STEPS) + 0.4 * max(0, step - 5 - RATE_SKIP_STEPS)
        seen.append((step, t.observe(step, elapsed)))
    planned = [(s, h) for s, h in seen if h is not None]
    assert [s for s, _ in planned] == [5 + RATE_SKIP_STEPS + RATE_STEPS]
    assert t.rate_s == pytest.approx(0.4)
    elapsed = 20.0 + 0.4 * RATE_STEPS
    want = t.plan_step + math.floor((100.0 - elapsed) * BUDGET_SHARE / 0.5)
    assert planned[0][1] == want


def test_timed_horizon_replans_halfway_from_the_rate_since_the_first_plan():
    """The first window is slow (0.6 s a step), the steps after it 0.4 s: the re-plan halfway
    to the first horizon plans from 0.4 s a step and so plans more steps; a schedule that cannot
    keep its rate (cosine) gets no re-plan, nor does a run too short to measure one."""
    t = TimedHorizon(budget_s=200.0, max_steps=10_000, start_step=0)

    def elapsed(step):  # 10 s of compiles, the window at 0.6 s, then 0.4 s
        window = min(max(0, step - t.mark_step), RATE_STEPS)
        return 10.0 + 0.6 * window + 0.4 * max(0, step - t.plan_step)

    assert t.observe(t.mark_step, elapsed(t.mark_step)) is None
    first = t.observe(t.plan_step, elapsed(t.plan_step))
    assert t.rate_s == pytest.approx(0.6) and not t.done
    t.planned(t.plan_step, first, replannable=True)
    half = t.plan_step + (first - t.plan_step) // 2
    assert t.replan_step == half
    assert [t.observe(k, elapsed(k)) for k in range(t.plan_step + 1, half)] == [None] * (
        half - t.plan_step - 1
    )
    second = t.observe(half, elapsed(half))
    assert t.rate_s == pytest.approx(0.4) and t.window == (t.plan_step + 1, half)
    assert second == half + math.floor((200.0 - elapsed(half)) * BUDGET_SHARE / 0.4) > first
    t.planned(half, second, replannable=True)
    assert t.done and t.replan_step is None
    for replannable, budget in ((False, 200.0), (True, 10.0 + 0.6 * RATE_STEPS + 5.0)):
        u = TimedHorizon(budget_s=budget, max_steps=10_000, start_step=0)
        u.observe(u.mark_step, elapsed(u.mark_step))
        u.planned(u.plan_step, u.observe(u.plan_step, elapsed(u.plan_step)), replannable)
        assert u.done


def test_a_periodic_evaluation_replaces_the_step0_estimate_and_leaves_the_step_rate():
    """The step-0 evaluation was priced at 0.5 s a step (its compiles); one at step 50 takes 3 s:
    the re-plan spreads those 3 s over the 50 steps and measures the steps without them."""
    t = TimedHorizon(budget_s=200.0, max_steps=10_000, start_step=0, overhead_per_step_s=0.5)
    evals = {50: 3.0}

    def elapsed(step):  # 10 s of compiles, then 0.4 s a step, plus the evaluations so far
        spent = sum(s for k, s in evals.items() if k <= step)
        return 10.0 + 0.4 * max(0, step - t.mark_step) + spent

    t.observe(t.mark_step, elapsed(t.mark_step))
    first = t.observe(t.plan_step, elapsed(t.plan_step))
    assert first == t.plan_step + math.floor((200.0 - 18.0) * BUDGET_SHARE / 0.9) == 218
    t.planned(t.plan_step, first, replannable=True)
    half = t.replan_step
    assert half == 120
    for k in range(t.plan_step + 1, half + 1):
        if k in evals:
            t.evaluated(evals[k], every=50, step=k)
        horizon = t.observe(k, elapsed(k))
    assert t.rate_s == pytest.approx(0.4)  # (60.2 - 3 - 18) / 98, not (60.2 - 18) / 98
    assert t.overhead_per_step_s == pytest.approx(3.0 / 50)
    assert horizon == half + math.floor((200.0 - 60.2) * BUDGET_SHARE / 0.46) == 414


def test_the_first_periodic_evaluation_replans_a_run_whose_halfway_replan_came_before_it():
    """As on 2026-12-05 evening: the step-0 evaluation priced evaluations at 0.5 s a step, the
    halfway re-plan (step 120) came before the first periodic evaluation (step 150, 2 s): that
    evaluation re-plans at once from its own cost, giving back the steps reserved for nothing;
    only then is the horizon done, and later evaluations re-plan no more."""
    t = TimedHorizon(budget_s=200.0, max_steps=10_000, start_step=0, overhead_per_step_s=0.5)
    evals = {150: 2.0, 300: 2.0}

    def elapsed(step):  # 10 s of compiles, then 0.4 s a step, plus the evaluations so far
        spent = sum(s for k, s in evals.items() if k <= step)
        return 10.0 + 0.4 * max(0, step - t.mark_step) + spent

    t.observe(t.mark_step, elapsed(t.mark_step))
    first = t.observe(t.plan_step, elapsed(t.plan_step))
    t.planned(t.plan_step, first, replannable=True)
    horizons = {}
    for k in range(t.plan_step + 1, 400):
        if k in evals:
            t.evaluated(evals[k], every=150, step=k)
        h = t.observe(k, elapsed(k))
        if h is not None:
            horizons[k] = h
            t.planned(k, h, replannable=True)
        if k == 140:
            assert not t.done  # re-planned halfway, still waiting for an evaluation's cost
    assert sorted(horizons) == [t.plan_step + (first - t.plan_step) // 2, 150]
    halfway = horizons[min(horizons)]
    assert halfway == 120 + math.floor((200.0 - elapsed(120)) * BUDGET_SHARE / 0.9)
    per_step = 0.4 + 2.0 / 150
    assert horizons[150] == 150 + math.floor((200.0 - elapsed(150)) * BUDGET_SHARE / per_step)
    assert horizons[150] > halfway + 100 and t.done
    # Without evaluations to wait for (none planned), the halfway re-plan ends the planning.
    u = TimedHorizon(budget_s=200.0, max_steps=10_000, start_step=0)
    u.observe(u.mark_step, 10.0)
    u.planned(u.plan_step, u.observe(u.plan_step, 18.0), replannable=True)
    u.planned(u.replan_step, 300, replannable=True)
    assert u.done


def test_a_replan_is_taken_only_where_the_rate_stays():
    wsd, cos = WSDSchedule(0.04, 0.1, 1000, decay_ratio=0.2), CosineSchedule(0.04, 0.1, 1000)
    assert WSDSchedule.replannable and not CosineSchedule.replannable
    assert wsd.same_rate_at(500, 1200) and wsd.same_rate_at(500, 700)  # stable phase either way
    assert not wsd.same_rate_at(500, 600)  # its decay would have begun before step 500
    assert not cos.same_rate_at(500, 1200) and cos.same_rate_at(500, 1000)
    assert wsd.horizon == cos.horizon == 1000  # asking changes nothing


def test_steady_eval_seconds_leaves_out_the_first_batchs_compile():
    assert steady_eval_seconds([30.0, 2.0, 2.2, 1.9, 2.1]) == pytest.approx(5 * 2.05)
    assert steady_eval_seconds([108.2, 0.5]) == pytest.approx(1.0)  # a median of two is their mean
    assert steady_eval_seconds([3.0]) == 3.0
    assert steady_eval_seconds([]) == 0.0


def test_a_time_boxed_run_plans_for_evaluations_without_their_compile(
    target,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
):
    """The run's first evaluation pays one-time costs (here a 2 s first batch, as torch.compile's
    is): the plan reserves what later evaluations cost, not that."""
    import train.loop.trainer

    real, calls = train.loop.trainer.capture_batch, []

    def slow_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the step-0 evaluation's first batch
            time.sleep(2.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(train.loop.trainer, "capture_batch", slow_first)
    slow_steps(monkeypatch, 0.05)
    args = (
        "trainer.max_steps=400",
        "trainer.max_seconds=4",
        "trainer.eval_every=10",
        "trainer.eval_batches=4",
        "data.heldout_max_rows=64",
    )
    assert main(fast(target, tmp_path / "run", *args)) == 0
    text = capsys.readouterr().out
    m = re.search(r"planned for \d+ steps .* and ([0-9.]+) s a step of evaluations", text)
    assert m, text
    # The wall time of that evaluation over eval_every would be >= 2 s / 10 = 0.2 s a step.
    assert 0 < float(m.group(1)) < 0.05
    e = re.search(r"step-0 evaluation: ([0-9.]+) s, ([0-9.]+) s once compiled \(4 batches\)", text)
    # the 2 s first batch is in the evaluation's wall time and not in its once-compiled figure
    # (an absolute margin: a ratio to the other batches' time failed on a loaded 2-core machine)
    assert e and float(e.group(1)) >= 2.0 and float(e.group(2)) < float(e.group(1)) - 1.5, text


@pytest.mark.parametrize("name", ["cosine", "wsd"])
def test_the_planned_horizon_survives_the_scheduler_state(name):
    p = torch.nn.Parameter(torch.zeros(1))
    o = OptimCfg(schedule=name, decay_ratio=0.3)
    s = make_schedule(o, 1000)
    sched = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([p], lr=1.0), s)
    s.horizon, s.planned = 321, True
    state = sched.state_dict()
    fresh = make_schedule(o, 1000)
    again = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([p], lr=1.0), fresh)
    again.load_state_dict(state)
    assert (fresh.horizon, fresh.planned) == (321, True)
    assert vars(fresh) == vars(s)
    assert [fresh(k) for k in range(330)] == [s(k) for k in range(330)]


def test_a_wsd_run_replans_halfway_and_ends_its_schedule_in_budget(
    target,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
):
    """Steps in the first window are slow (as the first steps after compiling are): the WSD run
    re-plans halfway from the faster steps since, for more steps, and the budget holds them, its
    rate the planned curve's at every step after the window.

    The trainer reads a stand-in clock that only its steps move (1/16 s a step in the window,
    1/64 s after; both exact in binary), so the plans and the last step do not depend on how
    busy the machine is: on a 2-core CI machine the wall clock once cut this run 16% short."""
    import train.loop.trainer

    clock = types.SimpleNamespace(now=0.0)
    real = train.loop.trainer.Trainer.train_step

    def timed_step(self):
        clock.now += 1 / 16 if self.step < RATE_SKIP_STEPS + RATE_STEPS else 1 / 64
        return real(self)

    def sleep(seconds):
        clock.now += seconds

    monkeypatch.setattr(train.loop.trainer.Trainer, "train_step", timed_step)
    fake_time = types.SimpleNamespace(perf_counter=lambda: clock.now, sleep=sleep)
    monkeypatch.setattr(train.loop.trainer, "time", fake_time)
    out = tmp_path / "run"
    budget = 10.0
    args = (
        "trainer.max_steps=1000",
        f"trainer.max_seconds={budget:g}",
        "trainer.eval_every=0",
        "trainer.save_every=0",  # a save is a one-time cost the rate does not hold
        "optim.schedule=wsd",
    )
    assert main(fast(target, out, *args)) == 0
    text = capsys.readouterr().out
    first = re.search(r"schedule planned for (\d+) steps", text)
    second = re.search(r"schedule re-planned for (\d+) steps .* over steps (\d+)-(\d+)", text)
    assert first and second, text
    window = RATE_SKIP_STEPS + RATE_STEPS
    # By hand: 22 steps take 1.375 s; 0.97 of the 8.625 s left holds 133 more steps at 1/16 s.
    assert int(first.group(1)) == window + math.floor((budget - window / 16) * 0.97 * 16) == 155
    assert int(second.group(2)) == window + 1
    replan = int(second.group(3))
    assert replan == window + (155 - window) // 2 == 88
    # 88 steps take 1.375 + 66/64 s; 0.97 of the 7.59 s left holds 471 more at 1/64 s.
    horizon = int(second.group(1))
    spent = window / 16 + (replan - window) / 64
    assert horizon == replan + math.floor((budget - spent) * 0.97 * 64) == 559
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["split"] == "train"]
    last = train[-1]["step"]
    assert last == horizon  # the budget held every re-planned step
    assert spent + (horizon - replan) / 64 <= budget
    o = compose_config(fast(target, out, *args)).optim
    # Up to the re-plan the first plan's curve holds, after it the re-planned one (their warm-ups
    # differ when the horizons do: 155 -> 559 steps moves it from 6 to 22 steps (4%), and steps
    # 7-22 ran at the full rate before the re-plan at step 88).
    before = curve_reference("wsd", o, int(first.group(1)), horizon + 1)
    after = curve_reference("wsd", o, horizon, horizon + 1)
    for r in train:
        if r["step"] > RATE_SKIP_STEPS + RATE_STEPS:
            curve = before if r["step"] <= replan else after
            assert r["lr"] == pytest.approx(o.lr * curve[r["step"]], rel=1e-6), r["step"]
    assert train[-1]["lr"] == pytest.approx(o.lr * o.min_lr_ratio, rel=0.05)  # annealed


def test_a_time_boxed_run_plans_from_its_periodic_evaluations(
    target,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
):
    """The step-0 evaluation is slow (1 s a batch, its compiles), the periodic ones are not (1/16 s
    each, every 10 steps): the trainer hands each periodic evaluation's time to the plan, which
    spreads it over 10 steps and leaves it out of the step rate. Planned from the step-0 figure
    (0.2 s a step) this run would stop its schedule at step 52 of the 10 s, not 400.

    A stand-in clock only the steps and evaluations move, as in the WSD test above; its figures
    are exact in binary and worked by hand."""
    import train.loop.trainer

    clock = types.SimpleNamespace(now=0.0, evaluating=False)
    evals = []
    real_step, real_eval = (
        train.loop.trainer.Trainer.train_step,
        train.loop.trainer.Trainer.evaluate,
    )
    real_capture = train.loop.trainer.capture_batch

    def timed_step(self):
        clock.now += 1 / 16 if self.step < RATE_SKIP_STEPS + RATE_STEPS else 1 / 64
        return real_step(self)

    def counted_eval(self):
        evals.append(self.step)
        clock.evaluating = True
        try:
            return real_eval(self)
        finally:
            clock.evaluating = False

    def timed_capture(*args, **kwargs):  # a training step's capture is in its 1/16 or 1/64 s
        if clock.evaluating:
            clock.now += 1.0 if len(evals) == 1 else 1 / 32
        return real_capture(*args, **kwargs)

    def sleep(seconds):
        clock.now += seconds

    monkeypatch.setattr(train.loop.trainer.Trainer, "train_step", timed_step)
    monkeypatch.setattr(train.loop.trainer.Trainer, "evaluate", counted_eval)
    monkeypatch.setattr(train.loop.trainer, "capture_batch", timed_capture)
    fake_time = types.SimpleNamespace(perf_counter=lambda: clock.now, sleep=sleep)
    monkeypatch.setattr(train.loop.trainer, "time", fake_time)
    out = tmp_path / "run"
    args = (
        "trainer.max_steps=1000",
        "trainer.max_seconds=10",
        "trainer.eval_every=10",
        "trainer.eval_batches=2",
        "data.heldout_max_rows=64",
        "trainer.save_every=0",
        "optim.schedule=wsd",
    )
    assert main(fast(target, out, *args)) == 0
    text = capsys.readouterr().out
    assert "step-0 evaluation: 2.0 s, 2.0 s once compiled (2 batches)" in text, text
    evals_re = r"and ([0-9.]+) s a step of evaluations"
    first = re.search(r"schedule planned for (\d+) steps .* " + evals_re, text)
    second = re.search(r"re-planned for (\d+) steps .* over steps (\d+)-(\d+) " + evals_re, text)
    assert first and second, text
    # Step 22: the steps took 22/16 s, the evaluations at 10 and 20 another 2/16; each costs
    # 1/160 s a step. 0.97 of the 8.5 s left holds 119 steps of 1/16 + 1/160 s.
    assert (int(first.group(1)), first.group(2)) == (22 + 119, "0.006")
    # Re-plan at 22 + 119 // 2 = 81: 59 steps of 1/64 s and evaluations at 30..80 (6/16 s) since;
    # 0.97 of the 7.203125 s left holds 319 steps of 1/64 + 1/160 s.
    assert (int(second.group(3)), int(second.group(2)), second.group(4)) == (81, 23, "0.006")
    per_step = 1 / 64 + 1 / 160
    assert int(second.group(1)) == 81 + math.floor((10 - 2.796875) * 0.97 / per_step) == 400
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in recs if r["split"] == "train"][-1]["step"] == 400  # and the budget held them


@pytest.mark.parametrize("name", ["cosine", "wsd"])
def test_a_time_boxed_run_plans_its_schedule_and_follows_it(
    name,
    target,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
):
    out = tmp_path / "run"
    slow_steps(monkeypatch, 0.05)
    args = (
        "trainer.max_steps=400",
        "trainer.max_seconds=4",
        f"optim.schedule={name}",
    )
    assert main(fast(target, out, *args)) == 0
    text = capsys.readouterr().out
    plans = re.findall(
        r"learning-rate schedule (?:re-)?planned for (\d+) steps \(max_steps 400\)", text
    )
    assert plans, text
    horizon = int(plans[-1])  # a WSD run may re-plan halfway (its stable rate stays as it was)
    assert RATE_SKIP_STEPS + RATE_STEPS <= horizon < 400
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["split"] == "train"]
    assert train[-1]["step"] <= horizon
    o = compose_config(fast(target, out, *args)).optim
    # every step after the plan follows the planned curve (LambdaLR: the lr after step k is f(k))
    after = [r for r in train if r["step"] > RATE_SKIP_STEPS + RATE_STEPS]
    assert after
    curve = curve_reference(name, o, horizon, horizon + 1)
    for r in after:
        assert r["lr"] == pytest.approx(o.lr * curve[r["step"]], rel=1e-6)
