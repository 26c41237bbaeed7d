"""Verification: greedy semantics, rejection sampling's single-step exactness and keying."""

import pytest
import torch
from scipy import stats

import common.sampling.verify as verify_mod
from common.sampling.draft_probs import DraftProbs
from common.sampling.gumbel import Stream, gumbel_sample, sampled_probs
from common.sampling.verify import PAD_ID, greedy_verify, rejection_verify
from tests.dist.tiny import single_thread  # noqa: F401


def _chi2_p(counts, probs) -> float:
    """Chi-square goodness-of-fit p-value of integer counts against probabilities."""
    counts, probs = torch.as_tensor(counts).double(), torch.as_tensor(probs).double()
    exp = probs / probs.sum() * counts.sum()
    keep = exp > 0
    assert counts[~keep].sum() == 0, "observed a zero-probability outcome"
    return float(stats.chisquare(counts[keep].numpy(), exp[keep].numpy()).pvalue)


def _one_hot_logits(ids, V):
    return torch.nn.functional.one_hot(ids, V).float() * 5.0


def test_greedy_verify_cases():
    V = 10
    draft = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]])
    target = torch.tensor([[1, 2, 3, 4], [1, 5, 3, 4], [7, 2, 3, 4], [1, 2, 3, 4]])
    L = torch.tensor([3, 3, 3, 1])
    for tgt in (target, _one_hot_logits(target, V)):
        out = greedy_verify(draft, tgt, L)
        assert out.num_accepted.tolist() == [3, 1, 0, 1]
        assert out.output_ids.tolist() == [
            [1, 2, 3, 4],  # all accepted: bonus after the last
            [1, 5, PAD_ID, PAD_ID],  # mismatch at 1: target argmax there
            [7, PAD_ID, PAD_ID, PAD_ID],
            [1, 2, PAD_ID, PAD_ID],  # verify_len 1: bonus = target row 1
        ]
        assert out.verified.tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0]]
        assert out.accepted.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 0, 0]]
        assert out.num_output.tolist() == [4, 2, 1, 2]


def test_rejection_at_temperature_zero_is_greedy():
    g = torch.Generator().manual_seed(0)
    R, N, V = 64, 5, 7
    logits = torch.randn(R, N + 1, V, generator=g)
    tgt = logits.argmax(-1)
    draft = torch.where(torch.rand(R, N, generator=g) < 0.7, tgt[:, :N], (tgt[:, :N] + 1) % V)
    L = torch.randint(0, N + 1, (R,), generator=g)
    zeros = torch.zeros(R)
    a = rejection_verify(draft, None, logits, zeros, torch.arange(R), torch.arange(R), L)
    b = greedy_verify(draft, logits, L)
    for f in ("num_accepted", "output_ids", "accepted", "verified"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_verify_len_zero_is_plain_target_sampling():
    g = torch.Generator().manual_seed(1)
    R, N, V = 32, 3, 9
    logits = torch.randn(R, N + 1, V, generator=g)
    temps, seeds, pos = torch.rand(R, generator=g) + 0.2, torch.arange(R) * 7, torch.arange(R) + 3
    draft = torch.randint(V, (R, N), generator=g)
    dp = torch.softmax(torch.randn(R, N, V, generator=g), -1)
    out = rejection_verify(draft, dp, logits, temps, seeds, pos, torch.zeros(R, dtype=torch.long))
    plain = gumbel_sample(logits[:, 0], temps, seeds, pos - 1, stream=Stream.TARGET)
    assert torch.equal(out.output_ids[:, 0], plain) and (out.num_accepted == 0).all()
    assert not out.verified.any()


def _single_step(p_d, p_t, n, seed_offset=0):
    """One drafted slot: x ~ p_d (keyed Gumbel, DRAFT stream), verify against p_t; returns the
    emitted token of each of n independent requests."""
    V = p_d.shape[0]
    seeds, pos = torch.arange(n) + seed_offset, torch.full((n,), 11)
    ones = torch.ones(n)
    x = gumbel_sample(p_d.log().expand(n, V), ones, seeds, pos - 1)
    probs = DraftProbs.from_target(p_d.expand(n, 1, V), x.unsqueeze(1))
    t_logits = torch.stack([p_t.log(), torch.zeros(V)]).expand(n, 2, V)
    out = rejection_verify(x.unsqueeze(1), probs, t_logits, ones, seeds, pos)
    return out.output_ids[:, 0], out


P_D = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05, 0.0])
P_T = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.1, 0.2])


def test_single_step_output_is_target_distribution():
    n = 20_000
    tok, out = _single_step(P_D, P_T, n)
    assert _chi2_p(torch.bincount(tok, minlength=6), P_T) > 1e-3
    # Acceptance rate is sum_x min(p_d, p_t) = 0.1 + 0.1 + 0.1 + 0.05 + 0.05 = 0.4.
    assert abs(float(out.accepted.float().mean()) - 0.4) < 0.015


def test_single_step_negative_checks(monkeypatch):
    """The chi-square above has the power to see the classic bugs."""
    n = 20_000
    # Residual replaced by p_t (resampling from the target after a rejection).
    with monkeypatch.context() as m:
        m.setattr(verify_mod, "_residual_probs", lambda p_t, p_d: p_t)
        tok, _ = _single_step(P_D, P_T, n)
    assert _chi2_p(torch.bincount(tok, minlength=6), P_T) < 1e-6
    # p_d not the distribution sampled from (here: a tempered version of it).
    V = 6
    seeds, pos, ones = torch.arange(n), torch.full((n,), 11), torch.ones(n)
    x = gumbel_sample(P_D.log().expand(n, V), ones, seeds, pos - 1)
    wrong = sampled_probs(P_D.log().expand(n, V), torch.full((n,), 2.0))
    probs = DraftProbs.from_target(wrong.unsqueeze(1), x.unsqueeze(1))
    t_logits = torch.stack([P_T.log(), torch.zeros(V)]).expand(n, 2, V)
    out = rejection_verify(x.unsqueeze(1), probs, t_logits, ones, seeds, pos)
    assert _chi2_p(torch.bincount(out.output_ids[:, 0], minlength=6), P_T) < 1e-6


@pytest.mark.parametrize("compact", [True, False])
def test_compact_and_dense_draft_probs_verify_identically(compact):
    g = torch.Generator().manual_seed(2)
    R, N, V, C = 16, 3, 12, 5
    cols = torch.randperm(V, generator=g)[:C].sort().values
    p = torch.softmax(torch.randn(R, N, C, generator=g), -1)
    idx = torch.multinomial(p.flatten(0, 1), 1, generator=g).view(R, N)
    draft = cols[idx]
    dp = DraftProbs(p, cols, p.gather(2, idx.unsqueeze(-1)).squeeze(-1), V)
    dense = dp.to_target()
    logits = torch.randn(R, N + 1, V, generator=g)
    args = (logits, torch.full((R,), 0.9), torch.arange(R), torch.arange(R))
    a = rejection_verify(draft, dp if compact else dense, *args)
    b = rejection_verify(draft, dense, *args)
    assert torch.equal(a.output_ids, b.output_ids) and torch.equal(a.accepted, b.accepted)
