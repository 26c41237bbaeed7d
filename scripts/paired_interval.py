"""A paired percentile bootstrap: the interval of a statistic of two runs over the same items
(requests, prompts), resampling the items together so what both runs share cancels.

    from scripts.paired_interval import paired_interval
    paired_interval(pairs, stat)   # pairs: [(a_i, b_i)], stat: list of pairs -> float
    tau_ratio_interval(rows, base_rows)   # two drafts' eval_acceptance.py rows, prompt by prompt

    python scripts/paired_interval.py EVAL.json DRAFT BASE [--pool DOMAIN...]   # DRAFT's tau
        # over BASE's, a table: each temperature and domain, then pooled over the domains (those
        # named by --pool only; eval_acceptance.py --json; its own table divides by the first
        # draft it ran)

Seeded, so a rerun of a table prints the same interval. It covers the spread between items
within one run of each, not what moves a whole run (another machine, another session).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.acceptance import bootstrap_interval as paired_interval  # noqa: E402
from common.acceptance import tau_of_prompts  # noqa: E402


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


def shown(ci: dict) -> str:
    return f"{ci['value']:.3f} | {ci['low']:.3f} | {ci['high']:.3f}"


def ratio_table(
    rows: list[dict], draft: str, base: str, pool: Sequence[str] | None = None
) -> list[str]:
    """Markdown lines: `draft`'s tau over `base`'s with its interval, for each temperature and
    domain both were evaluated on, then pooled over the domains of each temperature (only those
    in `pool` where given: e.g. the held-out ones, not a set of prompts the drafts trained on)."""
    ours = [r for r in rows if r["draft"] == draft]
    theirs = [r for r in rows if r["draft"] == base]
    if not ours or not theirs:
        raise SystemExit(f"no rows of draft {draft if not ours else base!r}")
    head = f"| T | domain | {draft} tau | {base} tau | {draft} / {base} |"
    lines = [head + " 95% low | 95% high (paired prompts) |", "|---|---|---|---|---|---|---|"]
    by_key = {(r["temperature"], r["domain"]): r for r in theirs}
    for t in sorted({r["temperature"] for r in ours}):
        here = [r for r in ours if r["temperature"] == t and (t, r["domain"]) in by_key]
        for r in sorted(here, key=lambda r: r["domain"]):
            b = by_key[(t, r["domain"])]
            ci = tau_ratio_interval([r], [b])
            lines.append(
                f"| {t:g} | {r['domain']} | {r['mean_acceptance_length']:.3f} | "
                f"{b['mean_acceptance_length']:.3f} | {shown(ci)} |"
            )
        pooled = [r for r in here if pool is None or r["domain"] in pool]
        if len(pooled) > 1:
            ci = tau_ratio_interval(pooled, [by_key[(t, r["domain"])] for r in pooled])
            name = "pooled" if pool is None else f"pooled ({', '.join(sorted(pool))})"
            lines.append(f"| {t:g} | {name} | - | - | {shown(ci)} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("eval_json", help="scripts/eval_acceptance.py --json output, with per_prompt")
    ap.add_argument("draft")
    ap.add_argument("base")
    ap.add_argument(
        "--pool", nargs="+", metavar="DOMAIN", help="pool these domains only (default: all)"
    )
    a = ap.parse_args(argv)
    with open(a.eval_json) as f:
        rows = json.load(f)
    print("\n".join(ratio_table(rows, a.draft, a.base, a.pool)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
