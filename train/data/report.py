"""What the data pass dropped or changed, per reason (`rows.REASONS`), and the bad-row share gate.

Three kinds of count: rows dropped (unparseable lines, malformed rows, rows the template cannot
render, rows left with nothing to supervise), turns dropped from kept rows (empty content, unknown
role), and rows kept but changed (truncated, final assistant turn only). The share that stops a
run is rows dropped / rows read, so a run on mostly broken data stops before training starts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from train.data.rows import REASONS, TURN_REASONS

ROW_KEPT_REASONS = ("final_turn_only", "regen_final_turn", "truncated", "split")


class BadDataShare(ValueError):
    """More rows were dropped than `data.max_bad_row_share` allows (config/data error, exit 2)."""


@dataclass
class DataReport:
    source: str = "data"
    rows: int = 0  # rows read, including lines that did not parse
    dropped: Counter = field(default_factory=Counter)  # reason -> rows dropped
    turns: Counter = field(default_factory=Counter)  # reason -> turns dropped from kept rows
    changed: Counter = field(default_factory=Counter)  # reason -> rows kept but changed
    examples: dict[str, str] = field(default_factory=dict)  # reason -> first example

    def drop(self, reason: str, example: str, n: int = 1) -> None:
        self.dropped[reason] += n
        self.examples.setdefault(reason, example)

    def note(self, reason: str, n: int = 1) -> None:
        """A turn dropped (TURN_REASONS) or a row changed (ROW_KEPT_REASONS)."""
        if reason in TURN_REASONS:
            self.turns[reason] += n
        elif reason in ROW_KEPT_REASONS:
            self.changed[reason] += n
        else:
            raise ValueError(f"{reason!r} is not a turn or kept-row reason")

    @property
    def bad_rows(self) -> int:
        return sum(self.dropped.values())

    @property
    def bad_share(self) -> float:
        return self.bad_rows / self.rows if self.rows else 0.0

    def lines(self) -> list[str]:
        """Human summary: a headline, then one line per reason."""
        if not (self.dropped or self.turns or self.changed):
            return [f"{self.source}: {self.rows} rows read, all used as they are"]
        out = [
            f"{self.source}: {self.rows} rows read, {self.rows - self.bad_rows} used, "
            f"{self.bad_rows} dropped ({self.bad_share:.1%})"
        ]
        for reason, n in sorted(self.dropped.items(), key=lambda kv: -kv[1]):
            out.append(f"  dropped {n} rows: {REASONS[reason]} (first: {self.examples[reason]})")
        for reason, n in sorted(self.turns.items()):
            out.append(f"  dropped {n} turns, rows kept: {REASONS[reason]}")
        for reason, n in sorted(self.changed.items()):
            out.append(f"  {n} rows {REASONS[reason]}")
        return out

    def check(self, max_share: float) -> None:
        """Raise BadDataShare if the dropped share exceeds `max_share`."""
        if self.bad_share > max_share:
            detail = "; ".join(line.strip() for line in self.lines()[1:] if "dropped" in line)
            raise BadDataShare(
                f"{self.source}: {self.bad_rows} of {self.rows} rows ({self.bad_share:.1%}) are "
                f"unusable, more than data.max_bad_row_share={max_share:g}: {detail}. Fix the "
                "data, or raise data.max_bad_row_share to train on the rest"
            )
