"""lab/analysis/markov_bias_scale.py --ranks: the Markov head cut to rank k, against the weighted
Eckart-Young cut of its bigram table B = W1 W2^T computed the plain way (an SVD of the whole
weighted table, float64)."""

import pytest
import torch

from lab.analysis.markov_bias_scale import rank_cut_map


def reference_cut(w1, w2, k, weights):
    b = w1.double() @ w2.double().T
    d = weights.double().sqrt()[:, None]
    u, s, vh = torch.linalg.svd(d * b, full_matrices=False)
    return (u[:, :k] * s[:k]) @ vh[:k] / d, float((s[:k] ** 2).sum() / (s**2).sum())


@pytest.mark.parametrize("k", [1, 3, 5])
def test_rank_cut_is_the_weighted_best_approximation(k):
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(40, 6, generator=g), torch.randn(30, 6, generator=g)
    weights = torch.rand(40, generator=g) * 10 + 0.1
    m, share = rank_cut_map(w1, w2, k, weights)
    want, want_share = reference_cut(w1, w2, k, weights)
    assert m.shape == (6, 30)
    torch.testing.assert_close(w1.double() @ m, want, rtol=1e-9, atol=1e-9)
    assert share == pytest.approx(want_share, rel=1e-12)


def test_full_rank_cut_is_the_head_and_weights_change_the_cut():
    g = torch.Generator().manual_seed(1)
    w1, w2 = torch.randn(40, 6, generator=g), torch.randn(30, 6, generator=g)
    m, share = rank_cut_map(w1, w2, 6, torch.ones(40))
    torch.testing.assert_close(w1.double() @ m, w1.double() @ w2.double().T, rtol=1e-9, atol=1e-9)
    assert share == pytest.approx(1.0)
    # a weight on one row makes the cut keep that row better than the unweighted cut does
    heavy = torch.ones(40)
    heavy[7] = 1e4
    b = w1.double() @ w2.double().T
    err = {}
    for name, w in (("flat", torch.ones(40)), ("heavy", heavy)):
        err[name] = float((w1.double()[7] @ rank_cut_map(w1, w2, 2, w)[0] - b[7]).norm())
    assert err["heavy"] < 0.1 * err["flat"]
