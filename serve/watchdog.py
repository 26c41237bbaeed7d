"""Acceptance watchdog: notice at serve time a draft that loads fine but no longer fits its target.

A wrong layout, a shifted layer id or another target revision load without error and show only as
acceptance collapsing. The checkpoint records the acceptance measured at the end of training
(provenance.json `expected_acceptance`, held-out when the run had held-out data); the watchdog
compares the served acceptance with it.

Rule (one place, used by the embedded server and by the vLLM sidecar):
- window: the most recent >= `window_drafts` drafts (default 256), pooled: the delta of the
  engine's cumulative counters (`SpecDecodeStats.since`) since the newest snapshot at least that
  many drafts back; with fewer drafts served so far there is no verdict;
- test: position 0 (every draft reaches it). With n drafts in the window and x accepted at
  position 0, alarm when a one-sided binomial test rejects "the realized rate is at least
  `ratio` x expected" (default ratio 0.5) at `alpha` (default 1e-3): P(X <= x | n, ratio x
  expected) < alpha. A draft at its recorded acceptance practically never fires; one that
  accepts less than half of what it did in training fires as soon as the window has the evidence.
- reported: the alarm, the window's drafts, realized vs expected conditional acceptance per
  position and the p-value: on the log (on each change of state) and as Prometheus gauges.

Sidecar for vLLM (started by `serve.launch engine=vllm` before vLLM takes the process over):
    python -m serve.watchdog --metrics-url http://127.0.0.1:8000/metrics --checkpoint CKPT
polls vLLM's /metrics (`vllm:spec_decode_num_drafts`, `..._num_accepted_tokens_per_pos`, parsed
with `prometheus_client.parser`), applies the same rule, logs, optionally serves its gauges
(`--port`), and exits when the process it watches (`--parent-pid`) is gone.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from serve.engine.stats import SpecDecodeStats, read_spec_counters

logger = logging.getLogger("serve.watchdog")
EXPECTED_KEY = "expected_acceptance"
MAX_SNAPSHOTS = 10_000


def expected_acceptance(ckpt_dir: str | os.PathLike | None) -> list[float] | None:
    """The per-position acceptance recorded with the checkpoint, or None."""
    if ckpt_dir is None:
        return None
    prov = Path(ckpt_dir) / "provenance.json"
    try:
        raw = json.loads(prov.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    rec = raw.get(EXPECTED_KEY) or {}
    values = rec.get("per_position") or (raw.get("final_metrics") or {}).get("acceptance_per_pos")
    if not values or not all(isinstance(v, (int, float)) and 0 <= v <= 1 for v in values):
        return None
    return [float(v) for v in values]


def binom_cdf(x: int, n: int, p: float) -> float:
    """P(X <= x) for X ~ Binomial(n, p), summed in log space (exact enough for n ~ 1e5)."""
    if x >= n or p <= 0.0:
        return 1.0
    if x < 0:
        return 0.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq
        for k in range(x + 1)
    ]
    m = max(terms)
    return min(1.0, math.exp(m) * sum(math.exp(t - m) for t in terms))


@dataclass(frozen=True)
class WatchdogRule:
    window_drafts: int = 256
    ratio: float = 0.5
    alpha: float = 1e-3

    def __post_init__(self):
        if self.window_drafts < 1 or not 0 < self.ratio <= 1 or not 0 < self.alpha < 1:
            raise ValueError(
                f"watchdog rule {self}: need window_drafts >= 1, 0 < ratio <= 1, 0 < alpha < 1"
            )


@dataclass
class WatchdogReading:
    alarm: bool
    drafts: int  # drafts in the window (0: no verdict yet)
    realized: list[float] = field(default_factory=list)  # conditional acceptance per position
    expected: list[float] = field(default_factory=list)
    p_value: float | None = None

    def describe(self) -> str:
        fmt = lambda xs: "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"  # noqa: E731
        return (
            f"realized acceptance per position {fmt(self.realized)} over the last {self.drafts} "
            f"drafts vs {fmt(self.expected)} recorded with the checkpoint (p={self.p_value:.2g})"
        )


class AcceptanceWatchdog:
    """Feed it the engine's cumulative counters (`observe`); it keeps the window itself."""

    def __init__(self, expected: list[float], rule: WatchdogRule | None = None):
        self.expected, self.rule = list(expected), rule or WatchdogRule()
        self._snaps: deque[SpecDecodeStats] = deque(maxlen=MAX_SNAPSHOTS)
        self.reading = WatchdogReading(False, 0, expected=self.expected)

    def observe(self, spec: SpecDecodeStats) -> WatchdogReading:
        if spec.num_speculative_tokens == 0:
            return self.reading
        if not self._snaps or spec.num_drafts < self._snaps[-1].num_drafts:  # start or reset
            self._snaps.clear()
            self._snaps.append(SpecDecodeStats(spec.num_speculative_tokens))
        self._snaps.append(spec.copy())
        need = self.rule.window_drafts
        base = None
        while self._snaps and spec.num_drafts - self._snaps[0].num_drafts >= need:
            base = self._snaps.popleft()
        if base is None:
            return self.reading  # not enough drafts yet: keep the last verdict
        self._snaps.appendleft(base)
        window = spec.since(base)
        expected = self.expected[: spec.num_speculative_tokens]
        x, n = window.num_accepted_tokens_per_pos[0], window.num_drafts
        p = binom_cdf(x, n, self.rule.ratio * expected[0])
        reading = WatchdogReading(
            p < self.rule.alpha, n, window.conditional_acceptance(), expected, p
        )
        if reading.alarm and not self.reading.alarm:
            logger.warning(
                "acceptance watchdog ALARM: %s. Position 0 accepts far less than in training: "
                "check the draft's layout keys and target_layer_ids against the target "
                "(python -m serve.check CKPT --target TARGET) and that the target revision is "
                "the one the draft was trained on.",
                reading.describe(),
            )
        elif self.reading.alarm and not reading.alarm:
            logger.info("acceptance watchdog cleared: %s", reading.describe())
        self.reading = reading
        return reading


def metric_families(reading: WatchdogReading, model_name: str):
    """Prometheus gauges of a reading (embedded server and sidecar alike)."""
    from prometheus_client.core import GaugeMetricFamily

    alarm = GaugeMetricFamily(
        "dspark:acceptance_watchdog_alarm",
        "1 while the served acceptance is far below the checkpoint's recorded acceptance.",
        labels=["model_name"],
    )
    alarm.add_metric([model_name], float(reading.alarm))
    drafts = GaugeMetricFamily(
        "dspark:acceptance_watchdog_window_drafts",
        "Drafts in the watchdog's window (0: no verdict yet).",
        labels=["model_name"],
    )
    drafts.add_metric([model_name], reading.drafts)
    families = [alarm, drafts]
    for kind, values in (("realized", reading.realized), ("expected", reading.expected)):
        g = GaugeMetricFamily(
            f"dspark:acceptance_watchdog_{kind}",
            f"{kind.capitalize()} conditional acceptance per draft position.",
            labels=["model_name", "position"],
        )
        for k, v in enumerate(values):
            g.add_metric([model_name, str(k)], v)
        families.append(g)
    return families


# ---------------------------------------------------------------- the vLLM sidecar


def spec_stats_from_metrics(text: str) -> SpecDecodeStats | None:
    """vLLM's cumulative spec-decode counters from a /metrics page (`read_spec_counters`:
    summed over label sets); None without drafts or per-position counts; the verified draft
    count only from our server's page (vLLM exports none)."""
    r = read_spec_counters(text)
    if "vllm:spec_decode_num_drafts" not in r.totals or not r.per_pos:
        return None
    positions = [r.per_pos.get(k, 0) for k in range(max(r.per_pos) + 1)]
    return SpecDecodeStats(
        len(positions),
        r.totals["vllm:spec_decode_num_drafts"],
        r.totals.get("vllm:spec_decode_num_draft_tokens", 0),
        r.totals.get("vllm:spec_decode_num_accepted_tokens", sum(positions)),
        positions,
        r.verified,
    )


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def poll(
    url: str,
    watchdog: AcceptanceWatchdog,
    interval_s: float,
    parent_pid: int | None = None,
    max_polls: int | None = None,
) -> WatchdogReading:
    """Poll `url` until the parent is gone (or `max_polls`), feeding the watchdog."""
    polls, waiting_said = 0, False
    while _alive(parent_pid) and (max_polls is None or polls < max_polls):
        polls += 1
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError) as e:
            if not waiting_said:
                logger.info("acceptance watchdog: waiting for %s (%s)", url, e)
                waiting_said = True
        else:
            stats = spec_stats_from_metrics(text)
            if stats is not None:
                watchdog.observe(stats)
        time.sleep(interval_s)
    return watchdog.reading


def sidecar_command(
    metrics_url: str, checkpoint: str, parent_pid: int, rule: WatchdogRule | None = None
) -> list[str]:
    rule = rule or WatchdogRule()
    return [
        sys.executable,
        "-m",
        "serve.watchdog",
        "--metrics-url",
        metrics_url,
        "--checkpoint",
        checkpoint,
        "--parent-pid",
        str(parent_pid),
        "--window-drafts",
        str(rule.window_drafts),
        "--ratio",
        str(rule.ratio),
        "--alpha",
        str(rule.alpha),
    ]


def spawn_sidecar(host: str, port: int, checkpoint: str | None) -> subprocess.Popen | None:
    """Start the sidecar for a vLLM server about to run in this process (exec keeps the pid);
    None when the checkpoint records no acceptance to compare with."""
    if checkpoint is None or expected_acceptance(checkpoint) is None:
        return None
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    cmd = sidecar_command(f"http://{local}:{port}/metrics", checkpoint, os.getpid())
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve.watchdog", description=__doc__)
    ap.add_argument("--metrics-url", required=True)
    ap.add_argument("--checkpoint", required=True, help="draft folder (its provenance.json)")
    ap.add_argument("--parent-pid", type=int, default=None, help="exit when this pid is gone")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between polls")
    ap.add_argument("--window-drafts", type=int, default=WatchdogRule.window_drafts)
    ap.add_argument("--ratio", type=float, default=WatchdogRule.ratio)
    ap.add_argument("--alpha", type=float, default=WatchdogRule.alpha)
    ap.add_argument("--port", type=int, default=None, help="serve the watchdog gauges here")
    a = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    expected = expected_acceptance(a.checkpoint)
    if expected is None:
        print(f"{a.checkpoint}: provenance.json records no acceptance to watch", file=sys.stderr)
        return 2
    dog = AcceptanceWatchdog(expected, WatchdogRule(a.window_drafts, a.ratio, a.alpha))
    if a.port is not None:
        from prometheus_client import CollectorRegistry, start_http_server

        class _Collector:
            def collect(self):
                yield from metric_families(dog.reading, a.checkpoint)

        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Collector())
        start_http_server(a.port, addr="127.0.0.1", registry=reg)
    poll(a.metrics_url, dog, a.interval, a.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
