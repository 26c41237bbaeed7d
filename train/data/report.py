"""What the data pass dropped or changed, per reason (`rows.REASONS`), and the bad-row share gate.

Four kinds of count: rows dropped as bad (unparseable lines, malformed rows, rows the template
cannot render, rows with nothing to supervise), rows skipped for length (longer than
`data.seq_len`, with their first answer token past it: good rows that a longer `seq_len` keeps),
turns dropped from kept rows (empty content, unknown role), and rows kept but changed (truncated,
final assistant turn only).

The gate: bad rows / rows read above `data.max_bad_row_share` stops a run, so a run on mostly
broken data stops before training. Rows skipped for length are not bad rows and do not count
there; they stop a run only when none is left, or when more than `MAX_LENGTH_SKIPPED_SHARE` of the
rows are skipped, where `seq_len` is surely wrong for the data (the message gives the `seq_len`
that keeps 95% of them).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from train.data.rows import REASONS, TURN_REASONS

ROW_KEPT_REASONS = ("final_turn_only", "regen_final_turn", "truncated", "split")
# Above this share of rows skipped for length, data.seq_len is wrong for the data: stop and say so.
MAX_LENGTH_SKIPPED_SHARE = 0.5
KEEP_QUANTILE = 0.95  # the seq_len suggested then keeps this share of the rows


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
    seq_len: int | None = None  # data.seq_len, once a length was checked
    # per row skipped for length: the shortest seq_len that keeps it (its first answer token in)
    too_long: list[int] = field(default_factory=list)

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

    def skip_for_length(self, seq_len: int, keeps_at: int) -> None:
        """A good row skipped because its first answer token lies past `seq_len`; `keeps_at` is the
        shortest seq_len that keeps it."""
        self.seq_len = seq_len
        self.too_long.append(keeps_at)

    @property
    def bad_rows(self) -> int:
        return sum(self.dropped.values())

    @property
    def bad_share(self) -> float:
        return self.bad_rows / self.rows if self.rows else 0.0

    @property
    def used(self) -> int:
        return self.rows - self.bad_rows - len(self.too_long)

    def seq_len_keeping(self, share: float) -> int | None:
        """The shortest seq_len that keeps `share` of the good rows (None: the current one does).
        Rows within seq_len need at most seq_len, so only the skipped rows' values are needed."""
        good = self.rows - self.bad_rows
        rank = math.ceil(share * good) - 1  # 0-based rank among the good rows, shortest first
        within = good - len(self.too_long)
        if rank < within:
            return None
        return sorted(self.too_long)[rank - within]

    def length_line(self) -> str:
        n = len(self.too_long)
        return (
            f"skipped {n} rows for length, not bad rows: their first answer starts past "
            f"data.seq_len={self.seq_len} (data.seq_len={max(self.too_long)} keeps them all)"
        )

    def lines(self) -> list[str]:
        """Human summary: a headline, then one line per reason."""
        if not (self.dropped or self.turns or self.changed or self.too_long):
            return [f"{self.source}: {self.rows} rows read, all used as they are"]
        skipped = f", {len(self.too_long)} skipped for length" if self.too_long else ""
        out = [
            f"{self.source}: {self.rows} rows read, {self.used} used, "
            f"{self.bad_rows} dropped ({self.bad_share:.1%}){skipped}"
        ]
        for reason, n in sorted(self.dropped.items(), key=lambda kv: -kv[1]):
            out.append(f"  dropped {n} rows: {REASONS[reason]} (first: {self.examples[reason]})")
        if self.too_long:
            out.append(f"  {self.length_line()}")
        for reason, n in sorted(self.turns.items()):
            out.append(f"  dropped {n} turns, rows kept: {REASONS[reason]}")
        for reason, n in sorted(self.changed.items()):
            out.append(f"  {n} rows {REASONS[reason]}")
        return out

    def check(self, max_share: float) -> None:
        """Raise BadDataShare if the bad share exceeds `max_share`, if rows skipped for length
        leave none, or if they are more than MAX_LENGTH_SKIPPED_SHARE of the good rows."""
        good = self.rows - self.bad_rows
        if self.too_long and (
            self.used == 0 or len(self.too_long) > MAX_LENGTH_SKIPPED_SHARE * good
        ):
            keep = self.seq_len_keeping(KEEP_QUANTILE)
            left = "no row is left" if self.used == 0 else f"only {self.used} rows are left"
            raise BadDataShare(
                f"{self.source}: data.seq_len={self.seq_len} is too short for this data: "
                f"{len(self.too_long)} of {good} usable rows ({len(self.too_long) / good:.0%}) "
                f"have their first answer past it, so {left}. data.seq_len={keep} keeps "
                f"{KEEP_QUANTILE:.0%} of them"
            )
        if self.bad_share > max_share:
            detail = "; ".join(line.strip() for line in self.lines()[1:] if "dropped" in line)
            raise BadDataShare(
                f"{self.source}: {self.bad_rows} of {self.rows} rows ({self.bad_share:.1%}) are "
                f"unusable, more than data.max_bad_row_share={max_share:g}: {detail}. Fix the "
                "data, or raise data.max_bad_row_share to train on the rest"
            )
