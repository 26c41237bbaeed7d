"""The learning-rate schedule: linear warm-up, then a decay to `min_lr_ratio` (`optim.schedule`:
cosine over the rest, or warmup-stable-decay), over a horizon that a time-boxed run can plan from
its measured step rate.

With `trainer.max_seconds` a run used to plan its cosine for `max_steps` and be cut wherever the
clock ran out, its learning rate still high. `TimedHorizon` plans once, after a few steps past the
compiles: it measures seconds per step, adds the periodic evaluations' share
(`steady_eval_seconds` of the first one), and shortens the horizon to the steps that fit the rest
of the budget, so the schedule (warm-up and decay both scaled to it) ends where the run does. The
horizon lives in the scheduler's state (`LambdaLR` saves a callable object's attributes), so
`resume=true` follows the same curve and stops at the same step.

Why warmup-stable-decay (`optim.schedule=wsd`, `WSDSchedule`): a cosine fitted to the budget
spends much of it at a lowered rate. On SmolLM2 a cosine planned to end within a 780 s budget gave
held-out analytic tau 2.106 at 783 steps, while the same recipe cut at step 623 of a 1,000-step
cosine, its learning rate still high, gave 2.230. WSD holds the peak rate after warm-up and decays
only over the last `decay_ratio` of the steps after warm-up, so a time-boxed run keeps its
learning rate high for most of its budget and still ends annealed.
"""

from __future__ import annotations

import copy
import math
import statistics
from dataclasses import dataclass

# Steps left out of the rate (the first ones compile and warm up caches), then steps measured.
RATE_SKIP_STEPS = 2
RATE_STEPS = 20
# The share of the remaining budget planned for: step times vary by a few percent.
BUDGET_SHARE = 0.97


def warmup_steps(warmup_ratio: float, horizon: int) -> int:
    """The warm-up of a `horizon`-step schedule, in steps (at least one)."""
    return max(1, round(warmup_ratio * horizon))


class _WarmupSchedule:
    """LambdaLR factor at optimizer step `step` (0-based) for a run of `horizon` steps: a linear
    warm-up over `warmup_ratio` of the horizon, then `decay(step, warmup)`. Every attribute is
    saved in the scheduler's state; `horizon` may be re-planned after construction."""

    def __init__(self, warmup_ratio: float, min_lr_ratio: float, horizon: int):
        self.warmup_ratio, self.min_lr_ratio = warmup_ratio, min_lr_ratio
        self.horizon = horizon
        self.planned = False  # True once a time budget has set the horizon

    def __call__(self, step: int) -> float:
        warmup = warmup_steps(self.warmup_ratio, self.horizon)
        if step < warmup:
            return (step + 1) / warmup
        return self.decay(step, warmup)

    # Whether a later re-plan can move the horizon without changing the rate at that step.
    replannable = False

    def decay(self, step: int, warmup: int) -> float:
        raise NotImplementedError

    def same_rate_at(self, step: int, horizon: int) -> bool:
        """Whether `horizon` gives `step` the factor this schedule gives it now: a re-plan then
        changes only the steps still to come."""
        other = copy.copy(self)
        other.horizon = horizon
        return other(step) == self(step)

    def _cosine(self, t: float) -> float:
        """1.0 at t=0 down to `min_lr_ratio` at t>=1."""
        t = min(1.0, t)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


class CosineSchedule(_WarmupSchedule):
    """Warm-up, then a cosine over the rest of the horizon."""

    def decay(self, step: int, warmup: int) -> float:
        return self._cosine((step - warmup) / max(1, self.horizon - warmup))


class WSDSchedule(_WarmupSchedule):
    """Warmup-stable-decay: warm-up, then 1.0, then a cosine to `min_lr_ratio` over the last
    `decay_ratio` of the steps after warm-up (at least one step), ending at `horizon`. In the
    stable phase a new horizon only moves the decay: it can be re-planned there."""

    replannable = True

    def __init__(
        self, warmup_ratio: float, min_lr_ratio: float, horizon: int, decay_ratio: float = 0.2
    ):
        super().__init__(warmup_ratio, min_lr_ratio, horizon)
        self.decay_ratio = decay_ratio

    def decay(self, step: int, warmup: int) -> float:
        decay_steps = max(1, round(self.decay_ratio * (self.horizon - warmup)))
        start = self.horizon - decay_steps
        if step < start:
            return 1.0
        return self._cosine((step - start) / decay_steps)


SCHEDULES = {"cosine": CosineSchedule, "wsd": WSDSchedule}


def make_schedule(optim_cfg, horizon: int) -> _WarmupSchedule:
    """The schedule `optim_cfg.schedule` names, for a run of `horizon` steps. A ValueError names
    the offending `optim.*` field (the config loader checks both first; this guards the rest)."""
    o = optim_cfg
    if o.schedule not in SCHEDULES:
        raise ValueError(f"optim.schedule={o.schedule!r}: choose one of {list(SCHEDULES)}")
    if not 0 < o.decay_ratio <= 1:
        raise ValueError(f"optim.decay_ratio={o.decay_ratio}: must be in (0, 1]")
    if o.schedule == "wsd":
        return WSDSchedule(o.warmup_ratio, o.min_lr_ratio, horizon, o.decay_ratio)
    return CosineSchedule(o.warmup_ratio, o.min_lr_ratio, horizon)


def steady_eval_seconds(batch_seconds: list[float]) -> float:
    """What an evaluation costs once compiled: its batch count times the median of its batches
    after the first. A run's first evaluation is also where torch.compile builds the evaluation
    graphs (its first batch), which later evaluations do not pay again: on SmolLM2 on the H200
    the first evaluation of a 780 s run took about 68 s and the next about 2 s, and planning with
    the 68 s left 160 s of the budget unused. The first
    batch is left out, not only outvoted: over two batches a median is their mean (108.7 s
    "once compiled" on the H100 on 2026-12-05, against about 1 s an evaluation later on)."""
    if len(batch_seconds) < 2:
        return sum(batch_seconds)
    return len(batch_seconds) * statistics.median(batch_seconds[1:])


@dataclass
class TimedHorizon:
    """Plans the schedule's horizon from the step rate: first when `step` reaches the end of the
    measurement window (`RATE_SKIP_STEPS + RATE_STEPS` steps into this process's run), then, for
    a schedule that holds its rate there (`replannable`), once more halfway to that horizon from
    the rate over all steps since. The first window runs slow (5-7% over the mean of steps 25-500
    in both SmolLM2 runs of the 2026-12-04 trim A/B), so the second plan
    gives the budget's steps back. The first periodic evaluation brings one more re-plan where
    a plan was already taken (`evaluated`): until then the plans price evaluations from the
    step-0 one, which can be far off."""

    budget_s: float  # trainer.max_seconds
    max_steps: int
    start_step: int  # the step this process started from (0, or the resumed step)
    overhead_per_step_s: float = 0.0  # periodic evaluations and saves, spread over the steps
    mark_t: float | None = None  # the steps' seconds (no evaluations) after step `mark_step`
    plan_t: float | None = None  # the same after step `plan_step`
    replan_step: int | None = None  # set by `planned` from the horizon every rank took
    plans: int = 0  # horizons taken (`planned`)
    rate_s: float = 0.0  # seconds a step measured over the last window
    window: tuple[int, int] = (0, 0)  # the steps that window spanned
    evals_s: float = 0.0  # seconds the periodic evaluations took so far (`evaluated`)
    replannable: bool = False  # the schedule's, from `planned`
    eval_priced: bool = False  # a plan has used a periodic evaluation's own time

    @property
    def _awaits_eval(self) -> bool:
        """Whether a periodic evaluation is still to re-price a plan taken without one."""
        return self.replannable and self.overhead_per_step_s > 0 and not self.eval_priced

    @property
    def mark_step(self) -> int:
        return self.start_step + RATE_SKIP_STEPS

    @property
    def plan_step(self) -> int:
        return self.mark_step + RATE_STEPS

    @property
    def done(self) -> bool:
        return self.plans > 0 and self.replan_step is None and not self._awaits_eval

    def evaluated(self, seconds: float, every: int, step: int) -> None:
        """A periodic evaluation (one every `every` steps) took `seconds`. It is not the run's
        first, so it holds no compile: later plans spread it over `every` steps in place of the
        step-0 estimate, and the step rate leaves it out. That estimate can be far off where more
        than the first batch compiles (a last batch of another shape): on SmolLM2 on the H100 on
        2026-12-05 it read 108.7 s against about 1 s at step 1000, and planning with it ended a
        480 s run's schedule after 299 s of steps. Where no re-plan is pending, a plan already taken
        is re-planned at once, after this step (`step`): the halfway re-plan can fall before the
        first periodic evaluation (on 2026-12-05 evening it came at step 489 of a run evaluating
        every 500, and the run used 258.6 s of its 330)."""
        self.evals_s += seconds
        self.overhead_per_step_s = seconds / every
        pending = self.replan_step is not None
        if self.plans and not pending and self._awaits_eval and self.plan_t is not None:
            self.replan_step = step

    def observe(self, step: int, elapsed_s: float) -> int | None:
        """After optimizer step `step`, `elapsed_s` into the budget: a planned horizon at the end
        of a window, else None."""
        steps_s = elapsed_s - self.evals_s  # what the steps alone took
        if step == self.mark_step:
            self.mark_t = steps_s
        if step == self.plan_step and self.mark_t is not None:
            self.plan_t = steps_s
            return self._horizon(self.mark_step, self.mark_t, step, steps_s, elapsed_s)
        if step == self.replan_step:
            return self._horizon(self.plan_step, self.plan_t, step, steps_s, elapsed_s)
        return None

    def planned(self, step: int, horizon: int, replannable: bool) -> None:
        """The horizon every rank took after `step`: a first plan sets the re-plan halfway to it
        (when the schedule allows one and the half holds a window's worth of steps)."""
        half = (horizon - step) // 2
        self.plans += 1
        first = self.plans == 1
        self.replannable = replannable
        self.eval_priced = self.eval_priced or self.evals_s > 0
        self.replan_step = step + half if first and replannable and half >= RATE_STEPS else None

    def _horizon(self, step0: int, t0: float, step: int, steps_s: float, elapsed_s: float) -> int:
        self.rate_s, self.window = (steps_s - t0) / (step - step0), (step0 + 1, step)
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
