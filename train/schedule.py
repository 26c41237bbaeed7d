"""The learning-rate schedule: linear warm-up, then cosine to `min_lr_ratio`, over a horizon that
a time-boxed run can plan from its measured step rate.

With `trainer.max_seconds` a run used to plan its cosine for `max_steps` and be cut wherever the
clock ran out, its learning rate still high. `TimedHorizon` plans once, after a few steps past the
compiles: it measures seconds per step, adds the periodic evaluations' share (timed on the first
one), and shortens the horizon to the steps that fit the rest of the budget, so the schedule
(warm-up and cosine both scaled to it) ends where the run does. The horizon lives in the
scheduler's state (`LambdaLR` saves a callable object's attributes), so `resume=true` follows the
same curve and stops at the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Steps left out of the rate (the first ones compile and warm up caches), then steps measured.
RATE_SKIP_STEPS = 2
RATE_STEPS = 20
# The share of the remaining budget planned for: step times vary by a few percent.
BUDGET_SHARE = 0.97


class CosineSchedule:
    """LambdaLR factor at optimizer step `step` (0-based) for a run of `horizon` steps."""

    def __init__(self, warmup_ratio: float, min_lr_ratio: float, horizon: int):
        self.warmup_ratio, self.min_lr_ratio = warmup_ratio, min_lr_ratio
        self.horizon = horizon
        self.planned = False  # True once a time budget has set the horizon

    def __call__(self, step: int) -> float:
        warmup = max(1, round(self.warmup_ratio * self.horizon))
        if step < warmup:
            return (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, self.horizon - warmup))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


@dataclass
class TimedHorizon:
    """Plans the schedule's horizon from the step rate, once, when `step` reaches the end of the
    measurement window (`RATE_SKIP_STEPS + RATE_STEPS` steps into this process's run)."""

    budget_s: float  # trainer.max_seconds
    max_steps: int
    start_step: int  # the step this process started from (0, or the resumed step)
    overhead_per_step_s: float = 0.0  # periodic evaluations and saves, spread over the steps
    mark_t: float | None = None  # elapsed_s after step `mark_step`
    rate_s: float = 0.0  # seconds a step measured over the window

    @property
    def mark_step(self) -> int:
        return self.start_step + RATE_SKIP_STEPS

    @property
    def plan_step(self) -> int:
        return self.mark_step + RATE_STEPS

    def observe(self, step: int, elapsed_s: float) -> int | None:
        """After optimizer step `step`, `elapsed_s` into the budget: the planned horizon at the
        end of the window, else None."""
        if step == self.mark_step:
            self.mark_t = elapsed_s
        if step != self.plan_step or self.mark_t is None:
            return None
        self.rate_s = (elapsed_s - self.mark_t) / RATE_STEPS
        per_step = self.rate_s + self.overhead_per_step_s
        return plan_horizon(step, elapsed_s, self.budget_s, per_step, self.max_steps)


def plan_horizon(
    step: int, elapsed_s: float, budget_s: float, per_step_s: float, max_steps: int
) -> int:
    """The last step a run can reach in `budget_s`, `step` steps and `elapsed_s` in, at
    `per_step_s` a step over `BUDGET_SHARE` of what is left; never past `max_steps`, never before
    `step`."""
    left = max(0.0, budget_s - elapsed_s) * BUDGET_SHARE
    fits = step + math.floor(left / per_step_s) if per_step_s > 0 else max_steps
    return max(step, min(max_steps, fits))
