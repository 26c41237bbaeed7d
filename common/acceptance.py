"""Acceptance arithmetic shared by training's evaluation, `serve.evaluate`, `serve.parity` and the
scripts: one definition of each figure.

- `chain_tau`: the analytic tau, the expected tokens per verification round of a block whose
  slot k is accepted with probability per_pos[k] once the slots before it are. Training pools
  1 - TV per slot over its evaluation contexts; serving pools sum(min(p_target, q_draft)) per slot
  over the rounds it served (at T=0 both are "the draft's argmax is the target's"). Either way the
  per-slot means are pooled first and chained after.
- `tau_of_prompts`: realized tau (vLLM's mean acceptance length), pooled over prompts:
  1 + accepted / rounds.
- `bootstrap_interval`: a seeded percentile bootstrap over items (prompts); items may be pairs, so
  the same call gives the paired interval of two drafts' ratio (what both runs share cancels).
- `two_proportion_test`: per-slot conditional acceptance of two runs, with the minimum detectable
  difference at the given power, so a test that cannot fail is visible as such.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from statistics import NormalDist


def chain_tau(per_pos: Sequence[float]) -> float:
    """Expected acceptance length of a block whose position k is accepted with probability
    per_pos[k] once the positions before it are: 1 + sum_k prod_{i<=k} per_pos[i]."""
    return 1.0 + sum(math.prod(per_pos[: k + 1]) for k in range(len(per_pos)))


def tau_of_prompts(per_prompt: Sequence[Sequence[int]]) -> float:
    """Mean acceptance length of prompts' [rounds, accepted]: 1 + accepted / rounds, pooled."""
    rounds = sum(r for r, _ in per_prompt)
    return 1.0 + sum(a for _, a in per_prompt) / rounds if rounds else 0.0


def bootstrap_interval(
    items: Sequence,
    stat: Callable[[Sequence], float],
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> dict | None:
    """{"value", "low", "high", "pairs"}: `stat(items)` and the percentile interval of `stat` over
    `resamples` draws of len(items) items with replacement; None for no items. Seeded, so a rerun
    prints the same interval."""
    if not items:
        return None
    rng = random.Random(seed)
    draws = sorted(stat(rng.choices(items, k=len(items))) for _ in range(resamples))
    tail = (1 - level) / 2
    return {
        "value": stat(items),
        "low": draws[int(tail * (resamples - 1))],
        "high": draws[int((1 - tail) * (resamples - 1) + 0.5)],
        "pairs": len(items),
    }


def tau_interval(per_prompt: Sequence[Sequence[int]], level: float = 0.95) -> dict | None:
    """Pooled realized tau of prompts' [rounds, accepted] with its bootstrap interval over the
    prompts (the rounds of one prompt are correlated; prompts are the independent unit)."""
    return bootstrap_interval(list(per_prompt), tau_of_prompts, level)


def paired_tau_ratio(
    per_prompt: Sequence[Sequence[int]], base_per_prompt: Sequence[Sequence[int]]
) -> dict | None:
    """Tau of one draft over another's on the same prompts (paired prompt by prompt), with the
    paired 95% bootstrap interval."""
    pairs = list(zip(per_prompt, base_per_prompt, strict=True))
    return bootstrap_interval(
        pairs, lambda ps: tau_of_prompts([a for a, _ in ps]) / tau_of_prompts([b for _, b in ps])
    )


def two_proportion_test(
    xa: float, na: float, xb: float, nb: float, alpha: float, power: float = 0.8
) -> dict:
    """Two-sided two-proportion z-test of xa/na against xb/nb (pooled standard error) at level
    `alpha`, with the minimum detectable difference at `power` for these sample sizes (the
    difference the test finds with that probability). No samples on a side: nothing tested
    (rejects False, mdd None)."""
    if min(na, nb) <= 0:
        return {"rate": [None, None], "n": [na, nb], "rejects": False, "mdd": None}
    z_test, z_power = NormalDist().inv_cdf(1 - alpha / 2), NormalDist().inv_cdf(power)
    pa, pb, pooled = xa / na, xb / nb, (xa + xb) / (na + nb)
    # At a pooled rate of 0 or 1 the binomial SE vanishes; the MDD uses the worst case (0.25) so
    # a tiny sample cannot claim power it lacks.
    var = pooled * (1 - pooled)
    se = math.sqrt(max(var, 1e-12) * (1 / na + 1 / nb))
    z = (pa - pb) / se
    return {
        "rate": [pa, pb],
        "n": [na, nb],
        "z": z,
        "p_value": 2 * (1 - NormalDist().cdf(abs(z))),
        "rejects": abs(z) > z_test,
        "mdd": (z_test + z_power) * math.sqrt(0.25 * (1 / na + 1 / nb)),
    }
