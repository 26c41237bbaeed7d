"""Table + plot of DSpark vs DFlash acceptance from `scripts/eval_acceptance.py --json` output.

    python scripts/plot_acceptance.py outputs/small_dspark_vs_dflash.json \
        --png outputs/small_dspark_vs_dflash.png

Prints a Markdown table: per (temperature, draft), the mean acceptance length pooled over the
domains (1 + accepted / drafts, vLLM's definition) and per domain, and the pooled ratio to the
--baseline draft (default: the first in the file). The PNG has one panel per (temperature,
domain): per-position conditional acceptance (accepted at k / drafts that reached k) for each
draft. A point needs at least --min-reached drafts at that position; later positions, reached
by few drafts, are left out rather than drawn as noise. --png needs matplotlib
(`pip install -e .[plot]`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serve.engine.stats import SpecDecodeStats  # noqa: E402


def pooled(rows: list[dict]) -> SpecDecodeStats:
    """The spec-decode counters behind `eval_acceptance.py` rows (one block size), summed:
    per-position counts are rate x drafts, whole numbers; accepted tokens = their sum."""
    counts = [[round(rate * r["drafts"]) for rate in r["per_position_rate"]] for r in rows]
    per_pos = [sum(col) for col in zip(*counts, strict=True)]
    return SpecDecodeStats(
        num_drafts=sum(r["drafts"] for r in rows),
        num_accepted_tokens=sum(per_pos),
        num_accepted_tokens_per_pos=per_pos,
    )


def pooled_tau(rows: list[dict]) -> float:
    """Mean acceptance length over several rows: drafts weight each row, as in vLLM's counters."""
    return pooled(rows).mean_acceptance_length


def table(rows: list[dict], baseline: str | None = None) -> str:
    drafts = list(dict.fromkeys(r["draft"] for r in rows))
    baseline = baseline or drafts[0]
    if baseline not in drafts:
        raise SystemExit(f"plot_acceptance: --baseline {baseline!r} is none of {drafts}")
    domains = sorted({r["domain"] for r in rows})
    groups = defaultdict(list)
    for r in rows:
        groups[r["temperature"], r["draft"]].append(r)
    head = ["T", "draft", "tau pooled", *(f"tau {d}" for d in domains), f"pooled / {baseline}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in sorted({r["temperature"] for r in rows}):
        base = pooled_tau(groups[t, baseline])
        for name in drafts:
            g = groups[t, name]
            per_dom = {r["domain"]: r["mean_acceptance_length"] for r in g}
            cells = [f"{t:g}", name, f"{pooled_tau(g):.3f}"]
            cells += [f"{per_dom[d]:.3f}" for d in domains]
            cells.append(f"{pooled_tau(g) / base:.3f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def conditional(row: dict, min_reached: int) -> tuple[list[int], list[float]]:
    """(positions, conditional acceptance) where at least `min_reached` drafts got there."""
    c = pooled([row])
    pairs = zip(c.reached_per_pos(), c.conditional_acceptance(), strict=True)
    kept = [(k + 1, p) for k, (n, p) in enumerate(pairs) if n >= min_reached]
    return [k for k, _ in kept], [p for _, p in kept]


def plot(rows: list[dict], png: Path, min_reached: int, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("plot_acceptance: --png needs matplotlib (pip install -e .[plot])") from e
    temps = sorted({r["temperature"] for r in rows})
    domains = sorted({r["domain"] for r in rows})
    fig, axes = plt.subplots(
        len(temps), len(domains), figsize=(4 * len(domains), 3 * len(temps)), squeeze=False
    )
    for i, t in enumerate(temps):
        for j, dom in enumerate(domains):
            ax = axes[i][j]
            for r in rows:
                if r["temperature"] == t and r["domain"] == dom:
                    x, y = conditional(r, min_reached)
                    label = f"{r['draft']} (tau {r['mean_acceptance_length']:.2f})"
                    ax.plot(x, y, marker="o", label=label)
            n = max(len(r["per_position_rate"]) for r in rows)
            ax.set_xticks(range(1, n + 1))
            ax.set_xlim(0.5, n + 0.5)
            ax.set_title(f"T={t:g}, {dom}")
            ax.set_ylim(0, 1)
            ax.set_xlabel("draft position k")
            ax.set_ylabel("P(accept k | reached k)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"{title} (points reached by >= {min_reached} drafts)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path, help="eval_acceptance.py --json output")
    ap.add_argument("--png", type=Path)
    ap.add_argument("--baseline", help="draft name the ratios divide by (default: the first)")
    ap.add_argument("--min-reached", type=int, default=30)
    ap.add_argument("--title", default="Per-position conditional acceptance")
    a = ap.parse_args(argv)
    rows = json.loads(a.json.read_text())
    if not rows:
        print(f"plot_acceptance: {a.json} has no rows", file=sys.stderr)
        return 2
    print(table(rows, a.baseline))
    if a.png:
        plot(rows, a.png, a.min_reached, a.title)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
