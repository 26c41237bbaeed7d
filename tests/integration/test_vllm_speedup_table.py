"""scripts/vllm_speedup_table.py: the decode speed-up and its paired bootstrap interval."""

import json
import math
import random

import pytest

from scripts.vllm_speedup_table import main, paired_speedup_interval


def run(tpots: dict[int, float | None], mean: float | None = None) -> dict:
    """A serve.bench JSON with these per-request TPOTs (ms) by request index."""
    own = [t for t in tpots.values() if t is not None]
    return {
        "completed": len(tpots),
        "failed": 0,
        "mean_tpot_ms": mean if mean is not None else sum(own) / len(own),
        "output_token_throughput": 1000.0,
        "mean_ttft_ms": 10.0,
        "requests": [{"index": i, "tpot_ms": t} for i, t in tpots.items()],
    }


def test_an_exact_halving_has_a_point_interval():
    base = run({i: 2.0 + 0.1 * i for i in range(20)})
    spec = run({i: (2.0 + 0.1 * i) / 2 for i in range(20)})
    ci = paired_speedup_interval(base, spec)
    assert ci["pairs"] == 20
    assert ci["value"] == pytest.approx(2.0) and ci["low"] == pytest.approx(2.0)
    assert ci["high"] == pytest.approx(2.0)


def test_requests_pair_by_index_not_by_order_and_unpaired_ones_drop():
    base = run({i: 1.0 + i for i in range(6)})
    # The DSpark run lists its requests in another order, one request decoded a single token
    # (no TPOT) and one never came back: they leave the pairs.
    spec_tpots = {5: 3.0, 0: 0.5, 3: 2.0, 1: 1.0, 2: None}
    spec = run(spec_tpots)
    ci = paired_speedup_interval(base, spec)
    assert ci["pairs"] == 4
    assert ci["value"] == pytest.approx((1 + 2 + 4 + 6) / (0.5 + 1.0 + 2.0 + 3.0))
    assert ci["low"] <= ci["value"] <= ci["high"]


def test_runs_without_request_figures_get_no_interval():
    old = {"completed": 3, "failed": 0, "mean_tpot_ms": 2.0}
    assert paired_speedup_interval(old, run({0: 1.0})) is None
    assert paired_speedup_interval(run({0: 1.0}), run({1: 1.0})) is None


def test_the_interval_matches_the_delta_method_on_a_large_sample():
    """An independent reference: for a ratio of paired means, the delta method's normal interval
    (variance of b - R d over n, divided by mean(d)^2); the bootstrap agrees within a few %."""
    rng = random.Random(1)
    n = 400
    b = [rng.uniform(1.5, 3.0) for _ in range(n)]
    d = [x / 1.4 * rng.uniform(0.8, 1.2) for x in b]
    ci = paired_speedup_interval(run(dict(enumerate(b))), run(dict(enumerate(d))))
    r = sum(b) / sum(d)
    md = sum(d) / n
    resid = [x - r * y for x, y in zip(b, d, strict=True)]
    se = math.sqrt(sum(e * e for e in resid) / (n - 1) / n) / md
    assert ci["value"] == pytest.approx(r)
    assert ci["low"] == pytest.approx(r - 1.96 * se, rel=0.01)
    assert ci["high"] == pytest.approx(r + 1.96 * se, rel=0.01)
    assert ci["high"] - ci["low"] == pytest.approx(2 * 1.96 * se, rel=0.1)


def test_the_table_prints_the_interval_and_writes_it(tmp_path, capsys):
    for c in (1, 8):
        (tmp_path / f"vllm_target_only_c{c}.json").write_text(json.dumps(run({0: 2.0, 1: 4.0})))
        (tmp_path / f"vllm_dspark_c{c}.json").write_text(json.dumps(run({0: 1.0, 1: 2.0})))
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "95% interval (paired requests)" in out and "2.00-2.00x (2)" in out
    rows = json.loads((tmp_path / "vllm_speedup.json").read_text())
    assert [r["decode_speedup_paired_ci95"]["pairs"] for r in rows] == [2, 2]
