"""A paired percentile bootstrap: the interval of a statistic of two runs over the same items
(requests, prompts), resampling the items together so what both runs share cancels.

    from scripts.paired_interval import paired_interval
    paired_interval(pairs, stat)   # pairs: [(a_i, b_i)], stat: list of pairs -> float
    tau_ratio_interval(rows, base_rows)   # two drafts' eval_acceptance.py rows, prompt by prompt

Seeded, so a rerun of a table prints the same interval. It covers the spread between items
within one run of each, not what moves a whole run (another machine, another session).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence


def paired_interval(
    pairs: Sequence,
    stat: Callable[[Sequence], float],
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> dict | None:
    """{"value", "low", "high", "pairs"}: `stat(pairs)` and the percentile interval of `stat`
    over `resamples` draws of len(pairs) pairs with replacement; None for no pairs."""
    if not pairs:
        return None
    rng = random.Random(seed)
    draws = sorted(stat(rng.choices(pairs, k=len(pairs))) for _ in range(resamples))
    tail = (1 - level) / 2
    return {
        "value": stat(pairs),
        "low": draws[int(tail * (resamples - 1))],
        "high": draws[int((1 - tail) * (resamples - 1) + 0.5)],
        "pairs": len(pairs),
    }


def tau_of_prompts(per_prompt) -> float:
    """Mean acceptance length of prompts' [rounds, accepted]: 1 + accepted / rounds, pooled."""
    rounds = sum(r for r, _ in per_prompt)
    return 1.0 + sum(a for _, a in per_prompt) / rounds if rounds else 0.0


def tau_ratio_interval(rows: list[dict], base_rows: list[dict]) -> dict | None:
    """Pooled tau of `rows` over that of `base_rows` (evaluation rows of two drafts; rows of the
    same temperature and domain pair prompt by prompt), with its paired 95% bootstrap interval
    over the prompts; None where a row lacks `per_prompt`."""
    base = {(r["temperature"], r["domain"]): r for r in base_rows}
    pairs = []
    for r in rows:
        b = base.get((r["temperature"], r["domain"]))
        if b is None or "per_prompt" not in r or "per_prompt" not in b:
            return None
        pairs += list(zip(r["per_prompt"], b["per_prompt"], strict=True))
    return paired_interval(
        pairs, lambda ps: tau_of_prompts([a for a, _ in ps]) / tau_of_prompts([b for _, b in ps])
    )
