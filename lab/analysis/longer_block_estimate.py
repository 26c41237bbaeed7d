"""What a longer block could add to realized acceptance, read off an evaluation at the current one.

    python lab/analysis/longer_block_estimate.py EVAL.json DRAFT BASE [--block 15]

EVAL.json: scripts/eval_acceptance.py --json (rows per draft, temperature and domain, with the
rounds reaching and accepting each slot). A round that accepts every slot of a block of B stops
at the cap; with a longer block it would go on. The estimate lets those rounds go on accepting
at the last slot's conditional rate for the extra slots, and changes nothing else: the rounds
start where they did. A guide for which run to spend a GPU on, not a measurement, and its
assumptions cut both ways: realized conditionals tend to rise slot by slot (the rounds that
get far are on easy text), while the extra slots sit further from the context and a draft
trained on a longer block spends part of its capacity on them. Checked (779680f:docs/benchmarks.md,
"The same pair for 2,000 steps"): on the tiny target, block 7 to a trained 15, within 0.6%; on
SmolLM2's engine rounds, 3 drafts to 7 (lab/analysis/longer_block_check.sh), 7.3% over: past the
first slots DFlash kept pace with DSpark in the rounds that got there, which a rate carried on
from the last slot cannot see.
"""

from __future__ import annotations

import argparse
import json
import sys


def extra_after_cap(cond: float, extra_slots: int) -> float:
    """Expected further acceptances of a round that reached the cap, each accepted at `cond`."""
    return sum(cond**j for j in range(1, extra_slots + 1))


def estimate(row: dict, block: int) -> dict:
    """`row`'s tau, the share of its rounds at the cap, its last slot's conditional acceptance
    (the engine's report, serve/engine/stats.py) and its tau with the block made `block` long."""
    cap = len(row["accepted_per_pos"])
    if block < cap:
        raise SystemExit(f"--block {block} is shorter than the evaluated block ({cap})")
    full, cond = row["per_position_rate"][-1], row["conditional_acceptance"][-1]
    tau = row["mean_acceptance_length"]
    return {
        "tau": tau,
        "full_rounds": full,
        "last_slot_conditional": cond,
        "tau_longer": tau + full * extra_after_cap(cond, block - cap),
    }


def table(rows: list[dict], draft: str, base: str, block: int) -> list[str]:
    by_key = {(r["draft"], r["temperature"], r["domain"]): r for r in rows}
    keys = sorted({(t, d) for (n, t, d) in by_key if n == draft and (base, t, d) in by_key})
    if not keys:
        raise SystemExit(f"no temperature and domain with rows of both {draft!r} and {base!r}")
    lines = [
        f"| T | domain | draft | tau | rounds at the cap | last slot's conditional "
        f"| tau at block {block} (estimate) | / {base} now | / {base} at block {block} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t, d in keys:
        ours, theirs = (estimate(by_key[(n, t, d)], block) for n in (draft, base))
        now, longer = ours["tau"] / theirs["tau"], ours["tau_longer"] / theirs["tau_longer"]
        for name, e in ((draft, ours), (base, theirs)):
            ratios = f"{now:.3f} | {longer:.3f}" if name == draft else "- | -"
            lines.append(
                f"| {t:g} | {d} | {name} | {e['tau']:.3f} | {e['full_rounds']:.3f} | "
                f"{e['last_slot_conditional']:.3f} | {e['tau_longer']:.3f} | {ratios} |"
            )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("eval_json")
    ap.add_argument("draft")
    ap.add_argument("base")
    ap.add_argument("--block", type=int, default=15, help="the longer block, in drafted slots")
    a = ap.parse_args(argv)
    with open(a.eval_json) as f:
        rows = json.load(f)
    print("\n".join(table(rows, a.draft, a.base, a.block)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
