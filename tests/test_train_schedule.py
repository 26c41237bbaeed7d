"""train/schedule.py: the cosine schedule against a float64 formula, the time-budget plan, its
round trip through the scheduler's saved state, and a time-boxed run that ends its schedule."""

import json
import math
import re

import pytest
import torch

from tests.test_distill import fast, target  # noqa: F401  (the module-scoped tiny target)
from train.config_io import compose_config
from train.distill import main
from train.schedule import (
    BUDGET_SHARE,
    RATE_SKIP_STEPS,
    RATE_STEPS,
    CosineSchedule,
    TimedHorizon,
    plan_horizon,
)


def reference(step: int, warmup_ratio: float, min_ratio: float, horizon: int) -> float:
    warmup = max(1, round(warmup_ratio * horizon))
    if step < warmup:
        return (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, horizon - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


@pytest.mark.parametrize("horizon,warmup_ratio,min_ratio", [(100, 0.04, 0.0), (7, 0.3, 0.1)])
def test_cosine_schedule_matches_the_formula(horizon, warmup_ratio, min_ratio):
    s = CosineSchedule(warmup_ratio, min_ratio, horizon)
    for step in range(horizon + 3):  # past the horizon it stays at the floor
        want = reference(step, warmup_ratio, min_ratio, horizon)
        assert s(step) == pytest.approx(want, abs=1e-12)
    assert s(horizon + 2) == pytest.approx(min_ratio)


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


def test_the_planned_horizon_survives_the_scheduler_state():
    p = torch.nn.Parameter(torch.zeros(1))
    s = CosineSchedule(0.04, 0.0, 1000)
    sched = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([p], lr=1.0), s)
    s.horizon, s.planned = 321, True
    state = sched.state_dict()
    fresh = CosineSchedule(0.04, 0.0, 1000)
    again = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([p], lr=1.0), fresh)
    again.load_state_dict(state)
    assert (fresh.horizon, fresh.planned) == (321, True)


def test_a_time_boxed_run_plans_its_schedule_and_follows_it(target, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    args = ("trainer.max_steps=400", "trainer.max_seconds=4", "trainer.step_delay_s=0.05")
    assert main(fast(target, out, *args)) == 0
    text = capsys.readouterr().out
    m = re.search(r"learning-rate schedule planned for (\d+) steps \(max_steps 400\)", text)
    assert m, text
    horizon = int(m.group(1))
    assert RATE_SKIP_STEPS + RATE_STEPS <= horizon < 400
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["split"] == "train"]
    assert train[-1]["step"] <= horizon
    o = compose_config(fast(target, out, *args)).optim
    # every step after the plan follows the planned curve (LambdaLR: the lr after step k is f(k))
    after = [r for r in train if r["step"] > RATE_SKIP_STEPS + RATE_STEPS]
    assert after
    for r in after:
        f = reference(r["step"], o.warmup_ratio, o.min_lr_ratio, horizon)
        assert r["lr"] == pytest.approx(o.lr * f, rel=1e-6)
