"""Engine counters, named as vLLM names them, and the periodic log line.

Speculative counters are pooled (sum, count) pairs, divided only when reported:
mean acceptance length = 1 + num_accepted_tokens / num_drafts; per-position acceptance rate
= num_accepted_tokens_per_pos[k] / num_drafts; draft acceptance rate = num_accepted_tokens /
num_draft_tokens. One "draft" = one request in one round; per-position counts are prefix counts
(position k counts a draft whose first k+1 tokens were all accepted), as vLLM's
`SpecDecodingStats.observe_draft` counts them.
Acceptance is counted before stop/max_tokens truncation, as vLLM's rejection sampler does.

Draft tokens mean what vLLM 0.34 means by `vllm:spec_decode_num_draft_tokens`: the tokens
SCHEDULED for verification, N (num_speculative_tokens) per draft, before adaptive verification
trims them (vLLM's scheduler counts `len(scheduled_spec_token_ids)`; the worker's
`reallocate_drafts` trims later and reports nothing back). So the draft acceptance rate of the
two stacks is the same quantity. The drafts the target actually verified are counted apart, in
`num_verified_draft_tokens` (equal to num_draft_tokens without adaptive verification; None in
counters read from vLLM, which does not report them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

logger = logging.getLogger("serve.engine")
# Prometheus name of `num_verified_draft_tokens` (ours: vLLM has no such counter).
VERIFIED_DRAFT_TOKENS = "dspark:spec_decode_num_verified_draft_tokens"
PER_POS_COUNTER = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass
class SpecCounterReading:
    """The spec-decode counters of one /metrics page, summed over label sets (engines)."""

    totals: dict[str, int]  # "vllm:spec_decode_*" counter name (no `_total`) -> value
    per_pos: dict[int, int]  # position -> accepted-at-position count
    verified: int | None  # VERIFIED_DRAFT_TOKENS (our engine only; None on vLLM's page)


def read_spec_counters(text: str) -> SpecCounterReading:
    """Parse a Prometheus exposition with `prometheus_client.parser`: `_created` samples are
    skipped, `_total` is optional. The one reader behind `serve.bench` and `serve.watchdog`,
    which each decide what a page with missing counters means to them."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, int] = {}
    per_pos: dict[int, int] = {}
    verified = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name, value = sample.name.removesuffix("_total"), int(sample.value)
            if name == PER_POS_COUNTER:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0) + value
            elif name == VERIFIED_DRAFT_TOKENS:
                verified = (verified or 0) + value
            elif name.startswith("vllm:spec_decode_"):
                totals[name] = totals.get(name, 0) + value
    return SpecCounterReading(totals, per_pos, verified)


@dataclass
class SpecDecodeStats:
    num_speculative_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # Draft tokens the target verified (after adaptive trimming); None where not reported.
    num_verified_draft_tokens: int | None = None

    def __post_init__(self):
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_speculative_tokens

    def add(
        self,
        drafts: int,
        draft_tokens: int,
        accepted: int,
        per_pos: Sequence[int],
        verified_draft_tokens: int | None = None,
    ) -> None:
        """Count one round: `drafts` requests were scheduled `draft_tokens` in all (N each),
        the target verified `verified_draft_tokens` of them (default: all), `accepted` were
        accepted, `per_pos[k]` requests accepted positions 0..k."""
        verified = draft_tokens if verified_draft_tokens is None else verified_draft_tokens
        self.num_drafts += drafts
        self.num_draft_tokens += draft_tokens
        self.num_verified_draft_tokens = (self.num_verified_draft_tokens or 0) + verified
        self.num_accepted_tokens += accepted
        for k, c in enumerate(per_pos):
            self.num_accepted_tokens_per_pos[k] += int(c)

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts (tokens emitted per draft round, bonus included)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted / scheduled draft tokens, vLLM's "draft acceptance rate" (0.0 when nothing
        was drafted)."""
        return self.num_accepted_tokens / max(self.num_draft_tokens, 1)

    @property
    def verified_acceptance_rate(self) -> float | None:
        """accepted / verified draft tokens (None where the verified count is not reported,
        0.0 when nothing was verified)."""
        if self.num_verified_draft_tokens is None:
            return None
        return self.num_accepted_tokens / max(self.num_verified_draft_tokens, 1)

    def per_position_rate(self) -> list[float]:
        d = self.num_drafts or 1
        return [a / d for a in self.num_accepted_tokens_per_pos]

    def reached_per_pos(self) -> list[int]:
        """Drafts that reached position k: all of them at k = 0, then those accepted at k - 1."""
        return [self.num_drafts, *self.num_accepted_tokens_per_pos[:-1]]

    def conditional_acceptance(self) -> list[float]:
        """Accepted at k / reached k, per position."""
        pairs = zip(self.num_accepted_tokens_per_pos, self.reached_per_pos(), strict=True)
        return [a / max(r, 1) for a, r in pairs]

    def since(self, before: SpecDecodeStats) -> SpecDecodeStats:
        """The counts added after `before`, an earlier copy of these counters (one with no
        per-position list yet counts as zeros)."""
        last = before.num_accepted_tokens_per_pos or [0] * len(self.num_accepted_tokens_per_pos)
        verified = self.num_verified_draft_tokens
        if verified is not None:
            verified -= before.num_verified_draft_tokens or 0
        return SpecDecodeStats(
            self.num_speculative_tokens,
            self.num_drafts - before.num_drafts,
            self.num_draft_tokens - before.num_draft_tokens,
            self.num_accepted_tokens - before.num_accepted_tokens,
            [a - b for a, b in zip(self.num_accepted_tokens_per_pos, last, strict=True)],
            verified,
        )

    def report(self) -> dict:
        """Drafts, draft tokens scheduled (drafts x N, vLLM's num_draft_tokens), draft tokens
        verified (fewer under adaptive verification; None where not reported), mean acceptance
        length, per-position (plain and conditional) rates and the pooled counts behind them
        (accepted at k, reached k)."""
        return {
            "drafts": self.num_drafts,
            "draft_tokens": self.num_draft_tokens,
            "verified_draft_tokens": self.num_verified_draft_tokens,
            "accepted_per_pos": list(self.num_accepted_tokens_per_pos),
            "reached_per_pos": self.reached_per_pos(),
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_rate": self.per_position_rate(),
            "conditional_acceptance": self.conditional_acceptance(),
        }

    def copy(self) -> SpecDecodeStats:
        return SpecDecodeStats(
            self.num_speculative_tokens,
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            list(self.num_accepted_tokens_per_pos),
            self.num_verified_draft_tokens,
        )


@dataclass
class EngineStats:
    """Everything the engine counts; `snapshot()` is safe to call from another thread."""

    spec: SpecDecodeStats
    prompt_tokens: int = 0
    generation_tokens: int = 0
    # Every request ends in exactly one of these: finished (stop or length), aborted (a
    # server-side error or cancel), disconnected (its client went away).
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_disconnected: int = 0
    steps: int = 0
    num_running: int = 0
    num_waiting: int = 0
    # Wall time by phase (seconds): the draft step's two stages, target forwards, context K/V.
    time_backbone: float = 0.0
    time_markov: float = 0.0
    time_verify: float = 0.0
    time_prefill: float = 0.0
    time_context: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @contextmanager
    def updating(self) -> Iterator[EngineStats]:
        """Hold the counters while the engine changes them; readers take `snapshot()`."""
        with self._lock:
            yield self

    def snapshot(self) -> EngineStats:
        with self._lock:
            d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k[0] != "_"}
            d["spec"] = self.spec.copy()
            return EngineStats(**d)


class StatLogger:
    """Logs vLLM's "SpecDecoding metrics" line every `interval` seconds (deltas since the last):
    "Drafted" and the draft acceptance rate count scheduled draft tokens, as vLLM's line does."""

    def __init__(self, interval: float = 10.0):
        self.interval = interval
        self._last_t = time.monotonic()
        self._last = SpecDecodeStats()

    def maybe_log(self, stats: EngineStats, force: bool = False) -> str | None:
        now = time.monotonic()
        if not force and now - self._last_t < self.interval:
            return None
        d = stats.spec.since(self._last)
        if d.num_drafts <= 0:
            return None
        acc, drafted = d.num_accepted_tokens, d.num_draft_tokens
        per_pos = d.per_position_rate()
        dt = max(now - self._last_t, 1e-9)
        line = (
            f"SpecDecoding metrics: Mean acceptance length: {d.mean_acceptance_length:.2f}, "
            f"Accepted throughput: {acc / dt:.2f} tokens/s, "
            f"Drafted throughput: {drafted / dt:.2f} tokens/s, "
            f"Accepted: {acc} tokens, Drafted: {drafted} tokens, "
            f"Per-position acceptance rate: {', '.join(f'{r:.3f}' for r in per_pos)}, "
            f"Avg Draft acceptance rate: {100 * d.draft_acceptance_rate:.1f}%"
        )
        logger.info(line)
        self._last_t, self._last = now, stats.spec.copy()
        return line
