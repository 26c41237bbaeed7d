"""Adaptive verification (paper Algorithm 1): brute-force agreement, the stop rule, fallbacks,
the SPS table and its profiler."""

import itertools

import pytest
import torch

from common.sampling.adaptive import SPSTable, plan_verify_lengths


def brute_force(conf: torch.Tensor, sps: SPSTable):
    """max over every prefix-length vector of Theta = (R + sum_r a_{r, L_r}) * SPS(R + sum L)."""
    R, N = conf.shape
    a = torch.cumprod(conf.double(), 1)
    best, arg = -1.0, None
    for lens in itertools.product(range(N + 1), repeat=R):
        tau = R + sum(float(a[r, : lens[r]].sum()) for r in range(R))
        theta = tau * float(sps(R + sum(lens)))
        if theta > best:
            best, arg = theta, lens
    return best, arg


def convex_latency_table(rng: torch.Generator, max_tokens: int) -> SPSTable:
    """SPS = 1 / latency with latency positive, increasing and convex in the tokens verified
    (flat-ish while memory-bound, then steeper): SPS decreasing, Theta unimodal."""
    sizes = list(range(1, max_tokens + 1))
    t0 = 1.0 + float(torch.rand(1, generator=rng))
    slope = 0.02 + 0.2 * float(torch.rand(1, generator=rng))
    knee = int(torch.randint(1, max_tokens, (1,), generator=rng))
    lat = [t0 + slope * n + 3 * slope * max(0, n - knee) ** 1.5 / max_tokens for n in sizes]
    return SPSTable(sizes, [1.0 / x for x in lat])


@pytest.mark.parametrize("trial", range(30))
def test_greedy_scheduler_matches_brute_force_optimum(trial):
    rng = torch.Generator().manual_seed(trial)
    R = int(torch.randint(1, 4, (1,), generator=rng))
    N = int(torch.randint(1, 5, (1,), generator=rng))
    conf = torch.rand(R, N, generator=rng) ** 0.5  # skew towards confident drafts
    sps = convex_latency_table(rng, R * (N + 1))
    plan = plan_verify_lengths(conf, sps)
    best, arg = brute_force(conf, sps)
    assert plan.theta == pytest.approx(best, rel=1e-9), (plan.verify_len.tolist(), arg)
    # The plan's own Theta is what it claims.
    a = torch.cumprod(conf.double(), 1)
    L = plan.verify_len.tolist()
    tau = R + sum(float(a[r, : L[r]].sum()) for r in range(R))
    assert plan.theta == pytest.approx(tau * float(sps(R + sum(L))), rel=1e-9)
    assert plan.num_tokens == R + sum(L)


def test_stops_at_first_non_improvement_not_global_optimum():
    """A dip then a rise in Theta: Algorithm 1 stops at the dip (a global search would not)."""
    conf = torch.tensor([[0.9, 0.9, 0.9]])
    # SPS: 4 tokens is terrible, 2 good, 3 slightly worse than 2 -> first non-improvement at 3.
    sps = SPSTable([1, 2, 3, 4], [10.0, 9.0, 5.0, 4.9])
    plan = plan_verify_lengths(conf, sps)
    assert plan.verify_len.tolist() == [1]
    # Theta(1 draft) = 1.9*9 = 17.1; Theta(2) = 2.71*5 = 13.55; Theta(3) = 3.439*4.9 = 16.85.
    assert plan.theta == pytest.approx(17.1)
    sps2 = SPSTable([1, 2, 3, 4], [10.0, 9.0, 4.0, 5.0])  # Theta(3) = 17.2 > 17.1, unreachable
    assert plan_verify_lengths(conf, sps2).verify_len.tolist() == [1]


def test_admitted_sets_are_prefixes_even_with_ties():
    conf = torch.tensor([[1.0, 1.0, 0.5, 1.0], [1.0, 0.2, 1.0, 1.0]])
    sps = SPSTable([1, 100], [1.0, 1.0])  # flat: every positive a improves Theta
    assert plan_verify_lengths(conf, sps).verify_len.tolist() == [4, 4]
    sps = SPSTable([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1.0] * 5 + [0.5] * 5)
    L = plan_verify_lengths(conf, sps).verify_len.tolist()
    # a = [[1, 1, .5, .5], [1, .2, .2, .2]]: the three 1.0s fit in 5 tokens at SPS 1; the next
    # (a = .5) would cost a halved SPS.
    assert L == [2, 1]


def test_fallbacks_verify_everything():
    conf = torch.rand(3, 4)
    assert plan_verify_lengths(conf, None).verify_len.tolist() == [4, 4, 4]
    sps = SPSTable([1, 10], [2.0, 1.0])
    assert plan_verify_lengths(None, sps, num_reqs=2, num_drafts=5).verify_len.tolist() == [5, 5]
    with pytest.raises(ValueError):
        plan_verify_lengths(None, sps)


def test_sps_table_lookup_and_json_roundtrip(tmp_path):
    t = SPSTable([2, 4, 8], [100.0, 80.0, 40.0], {"gpu": "x"})
    got = t(torch.tensor([1, 2, 3, 4, 6, 8, 16]))
    assert got.tolist() == pytest.approx([100, 100, 90, 80, 60, 40, 20])
    t.save(tmp_path / "sps.json")
    back = SPSTable.load(tmp_path / "sps.json")
    assert (back.sizes, back.sps, back.meta) == (t.sizes, t.sps, t.meta)
    with pytest.raises(ValueError):
        SPSTable([4, 2], [1.0, 2.0])


def test_profile_padded_costs_times_each_shape(monkeypatch):
    import common.sampling.draft_budget as budget_mod

    clock = [0.0]
    monkeypatch.setattr(budget_mod.time, "perf_counter", lambda: clock[0])
    calls = []

    def draft(r):  # fake time: a draft step costs r ms, a [r, q] verify 10 r q ms
        calls.append(("d", r))
        clock[0] += r / 1000

    def verify(r, q):
        calls.append(("v", r, q))
        clock[0] += 10 * r * q / 1000

    table = budget_mod.profile_padded_costs(
        draft, verify, 3, 2, warmup=1, iters=2, sync=lambda: None
    )
    assert calls[:3] == [("d", 1)] * 3 and ("v", 3, 3) in calls and ("v", 3, 4) not in calls
    assert table.meta["profiled_num_reqs"] == [1, 2, 3]
    assert table.draft_ms == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert table.verify_ms[2] == pytest.approx([0.0, 20.0, 40.0, 60.0])
    # R = 3 measured; a profile with R = 1, 2, 4 would interpolate R = 3 linearly.
    assert table.verify_ms[3][3] == pytest.approx(90.0)
