"""Keyed Gumbel sampling: hash pinned to a reference, reproducibility, batch-composition
independence, stream independence, greedy semantics and the sampled distribution."""

import pytest
import torch
from scipy import stats

from common.sampling.gumbel import (
    Stream,
    categorical_from_probs,
    gumbel_sample,
    keyed_uniform,
    mix64,
    mix64_int,
    sampled_probs,
)
from tests.dist.tiny import single_thread  # noqa: F401


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def test_mix64_matches_unsigned_reference():
    xs = [0, 1, 2, -1, -(2**63), 2**63 - 1, 0x123456789ABCDEF, -987654321, 42 << 40]
    got = mix64(torch.tensor(xs, dtype=torch.long)).tolist()
    assert got == [_signed(mix64_int(x)) for x in xs]
    assert _signed(mix64_int(0x9E3779B97F4A7C15)) == _signed(0xE220A8397B1DCDAF)  # splitmix64


def test_uniform_open_interval_and_exact():
    s = torch.arange(64)
    u = keyed_uniform(s, s * 3, torch.arange(1000), Stream.DRAFT)
    assert u.dtype == torch.float32 and (u > 0).all() and (u < 1).all()
    u64 = keyed_uniform(s, s * 3, torch.arange(1000), Stream.DRAFT, fp64=True)
    assert u64.dtype == torch.float64 and (u64 > 0).all() and (u64 < 1).all()
    # float32 uniforms are the top 23 bits of the float64 ones' 52: same draw, coarser.
    assert (u - u64).abs().max() < 2**-22
    assert abs(float(u.mean()) - 0.5) < 0.01


def test_reproducible_and_batch_composition_independent():
    g = torch.Generator().manual_seed(0)
    R, V = 12, 50
    logits = torch.randn(R, V, generator=g)
    temp = torch.rand(R, generator=g) + 0.3
    seeds = torch.randint(1 << 50, (R,), generator=g)
    pos = torch.randint(0, 10_000, (R,), generator=g)
    a = gumbel_sample(logits, temp, seeds, pos)
    assert torch.equal(a, gumbel_sample(logits, temp, seeds, pos))
    perm = torch.randperm(R, generator=g)
    assert torch.equal(a[perm], gumbel_sample(logits[perm], temp[perm], seeds[perm], pos[perm]))
    for i in range(R):
        sl = slice(i, i + 1)
        assert int(gumbel_sample(logits[sl], temp[sl], seeds[sl], pos[sl])) == int(a[i])
    # A different seed, position or stream is a different draw (for some rows at least).
    assert not torch.equal(a, gumbel_sample(logits, temp, seeds + 1, pos))
    assert not torch.equal(a, gumbel_sample(logits, temp, seeds, pos + 1))
    assert not torch.equal(a, gumbel_sample(logits, temp, seeds, pos, stream=Stream.TARGET))


def test_streams_are_uncorrelated():
    s = torch.arange(20_000)
    col = torch.zeros(1, dtype=torch.long)
    u = {st: keyed_uniform(s, s, col, st)[:, 0] for st in Stream}
    for a in Stream:
        for b in Stream:
            if a < b:
                r = torch.corrcoef(torch.stack([u[a], u[b]]))[0, 1]
                assert abs(float(r)) < 0.03, (a, b)


def test_greedy_rows_are_argmax_first_max_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 5.0]])
    temp = torch.tensor([0.0, -1.0])
    ids = gumbel_sample(logits, temp, torch.tensor([1, 2]), torch.tensor([7, 8]))
    assert ids.tolist() == [1, 0]
    probs = sampled_probs(logits, temp)
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_columns_are_keyed_so_subsets_draw_the_same_noise():
    """A top-k row (candidates + their column keys) draws exactly what the dense row with -inf
    elsewhere draws."""
    g = torch.Generator().manual_seed(1)
    R, V, k = 64, 40, 6
    logits = torch.randn(R, V, generator=g)
    temp, seeds, pos = torch.full((R,), 0.9), torch.arange(R), torch.arange(R) + 5
    cand = torch.randperm(V, generator=g)[:k].sort().values.expand(R, k)
    dense = torch.full_like(logits, float("-inf")).scatter(1, cand, logits.gather(1, cand))
    sub = gumbel_sample(logits.gather(1, cand), temp, seeds, pos, cols=cand)
    assert torch.equal(
        cand.gather(1, sub.unsqueeze(1)).squeeze(1), gumbel_sample(dense, temp, seeds, pos)
    )


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("vary", ["seed", "position"])
def test_empirical_distribution_matches_softmax(temperature, vary):
    n, V = 20_000, 10
    logits = torch.linspace(-2.0, 1.5, V).roll(3).unsqueeze(0).expand(n, V)
    idx = torch.arange(n)
    seeds, pos = (idx, torch.full((n,), 17)) if vary == "seed" else (torch.full((n,), 3), idx)
    temp = torch.full((n,), temperature)
    ids, probs = gumbel_sample(logits, temp, seeds, pos), sampled_probs(logits, temp)
    counts = torch.bincount(ids, minlength=V).double()
    expected = torch.softmax(logits[0].double() / temperature, -1)
    torch.testing.assert_close(probs[0].double(), expected, rtol=1e-5, atol=1e-7)
    p = stats.chisquare(counts.numpy(), (expected * n).numpy()).pvalue
    assert p > 1e-3, p
    # The same counts are far from the distribution at another temperature.
    other = torch.softmax(logits[0].double() / (temperature * 1.3), -1)
    assert stats.chisquare(counts.numpy(), (other * n).numpy()).pvalue < 1e-6


def test_categorical_from_unnormalised_weights():
    n = 20_000
    w = torch.tensor([0.0, 2.0, 1.0, 0.0, 5.0]).expand(n, 5)  # sums to 8, not 1
    ids = categorical_from_probs(w, torch.arange(n), torch.zeros(n, dtype=torch.long))
    counts = torch.bincount(ids, minlength=5).double()
    assert counts[0] == 0 and counts[3] == 0
    exp = torch.tensor([2.0, 1.0, 5.0]) / 8 * n
    assert stats.chisquare(counts[[1, 2, 4]].numpy(), exp.numpy()).pvalue > 1e-3
