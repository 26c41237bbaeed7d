"""Prometheus exposition of the engine's counters under vLLM's metric names.

A custom collector reads one `EngineStats.snapshot()` per scrape, so the numbers come from the
engine's own counters (single source of truth) and all series of a scrape are consistent.
Counters are exposed as prometheus_client renders counters, i.e. with a `_total` suffix
(`vllm:spec_decode_num_drafts_total`), exactly as vLLM's own /metrics shows them. Each vLLM
name means what vLLM 0.34 means by it (`vllm:spec_decode_num_draft_tokens`: drafts scheduled,
before adaptive verification); counters vLLM lacks carry our `dspark:` prefix
(`dspark:spec_decode_num_verified_draft_tokens`: drafts the target verified).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from serve.engine import Engine
from serve.engine.stats import VERIFIED_DRAFT_TOKENS
from serve.watchdog import AcceptanceWatchdog, metric_families


class EngineCollector:
    def __init__(self, engine: Engine, model_name: str, watchdog: AcceptanceWatchdog | None = None):
        self.engine, self.model_name, self.watchdog = engine, model_name, watchdog

    def _counter(self, name, doc, value, extra=None):
        labels = ["model_name", *(extra or {})]
        c = CounterMetricFamily(name, doc, labels=labels)
        c.add_metric([self.model_name, *(extra or {}).values()], value)
        return c

    def collect(self):
        s = self.engine.stats.snapshot()
        m = self.model_name
        yield self._counter("vllm:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens)
        yield self._counter(
            "vllm:generation_tokens", "Generation tokens emitted.", s.generation_tokens
        )
        # Each request ends in exactly one of these three (vLLM's request_success also counts
        # aborts, under a finished_reason label; ours counts stop and length only).
        yield self._counter(
            "vllm:request_success", "Requests finished (stop or length).", s.requests_finished
        )
        yield self._counter(
            "dspark:request_aborted",
            "Requests aborted by the server (engine error, shutdown).",
            s.requests_aborted,
        )
        yield self._counter(
            "dspark:request_disconnected",
            "Requests ended because their client went away first.",
            s.requests_disconnected,
        )
        yield self._counter("dspark:engine_steps", "Engine steps run.", s.steps)
        # Leak detectors, read live (len() is atomic): slots not on the free list and request
        # objects the engine still holds. Both must be 0 whenever the server is idle.
        slots_used = self.engine.opts.max_num_seqs - self.engine.scheduler.num_free_slots
        for name, doc, val in (
            ("dspark:kv_slots_used", "KV cache slots in use.", slots_used),
            ("dspark:engine_requests", "Requests held by the engine.", len(self.engine.requests)),
        ):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric([m], val)
            yield g
        for name, val in (("running", s.num_running), ("waiting", s.num_waiting)):
            g = GaugeMetricFamily(
                f"vllm:num_requests_{name}", f"Requests {name}.", labels=["model_name"]
            )
            g.add_metric([m], val)
            yield g
        if self.engine.num_spec == 0:
            return
        sp = s.spec
        yield self._counter(
            "vllm:spec_decode_num_drafts", "Drafts (one per request per round).", sp.num_drafts
        )
        # vLLM's meaning: drafts scheduled, N per draft, before adaptive verification trims
        # them. What the target verified is ours alone, under our own prefix.
        yield self._counter(
            "vllm:spec_decode_num_draft_tokens",
            "Draft tokens scheduled for verification (num_speculative_tokens per draft, "
            "before adaptive verification trims them), as vLLM counts them.",
            sp.num_draft_tokens,
        )
        yield self._counter(
            VERIFIED_DRAFT_TOKENS,
            "Draft tokens the target verified (after adaptive verification's trim; equal to "
            "vllm:spec_decode_num_draft_tokens without it).",
            sp.num_verified_draft_tokens or 0,
        )
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens.", sp.num_accepted_tokens
        )
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens per draft position.",
            labels=["model_name", "position"],
        )
        for k, v in enumerate(sp.num_accepted_tokens_per_pos):
            per_pos.add_metric([m, str(k)], v)
        yield per_pos
        t = CounterMetricFamily(
            "dspark:time_seconds", "Engine wall time by phase.", labels=["model_name", "phase"]
        )
        for phase in ("backbone", "markov", "verify", "prefill", "context"):
            t.add_metric([m, phase], getattr(s, f"time_{phase}"))
        yield t
        if self.watchdog is not None:
            yield from metric_families(self.watchdog.observe(sp), m)


def make_registry(
    engine: Engine, model_name: str, watchdog: AcceptanceWatchdog | None = None
) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(EngineCollector(engine, model_name, watchdog))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
