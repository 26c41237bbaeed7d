"""The online acceptance estimator against vLLM 0.34.0's `OnlineAcceptanceEstimator`, its Triton
kernels run by Triton's CPU interpreter (tests/vllm_oracle.py; skipped without the files).

Random rounds: per-slot draft logits (peaked and flat rows, ties for the max, -inf columns as a
top-k walk leaves them, greedy temperatures), random verification outcomes, refits every few
rounds: features, predictions, slope and intercepts agree to float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.sampling.acceptance_estimator import OnlineAcceptanceEstimator, max_log_odds
from tests import vllm_oracle

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def random_logits(gen: np.random.Generator, r: int, v: int) -> torch.Tensor:
    x = gen.normal(size=(r, v)) * gen.choice([0.1, 2.0, 8.0], size=(r, 1))
    x[gen.random(r) < 0.2, :3] = 5.0  # three tokens tied for the max
    x[gen.random((r, v)) < 0.1] = -np.inf
    return torch.from_numpy(x.astype(np.float32))


def test_estimator_equals_vllm_over_rounds_with_refits():
    ns = vllm_oracle.load("acceptance_estimator")
    gen = np.random.default_rng(0)
    slots, n, v, refit = 6, 4, 50, 3
    ref = ns["OnlineAcceptanceEstimator"](slots, n, torch.device("cpu"))
    ref.REFIT_INTERVAL = refit
    ours = OnlineAcceptanceEstimator(slots, n)
    ours.REFIT_INTERVAL = refit
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 2.0])
    conf_buf = torch.zeros(slots, n)
    moved = False
    for _ in range(12):
        r = int(gen.integers(1, slots + 1))
        rows = torch.from_numpy(gen.permutation(slots)[:r].copy())
        for k in range(n):
            logits = random_logits(gen, r, v)
            ref.predict(logits, rows, torch.tensor(k, dtype=torch.int32), conf_buf, temperature)
            p = ours.predict(logits, rows, k, temperature[rows])
            torch.testing.assert_close(p, conf_buf[:r, k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.features[rows], ref.features[rows], rtol=1e-4, atol=1e-5)
        verified = torch.from_numpy(gen.integers(0, n + 1, size=r))
        accepted = torch.minimum(verified, torch.from_numpy(gen.integers(0, n + 1, size=r)))
        num_sampled, num_rejected = accepted + 1, verified - accepted
        ref.step(rows, num_sampled.int(), num_rejected.int())
        ours.step(rows, num_sampled, num_rejected)
        torch.testing.assert_close(ours.slope, ref.slope, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(ours.intercepts, ref.intercepts, rtol=1e-4, atol=1e-6)
        moved |= not torch.allclose(ours.intercepts, torch.full((n,), -0.2))
    assert moved, "no refit changed the coefficients: the comparison saw only the cold start"


def test_max_log_odds_is_the_logit_of_the_top_probability_in_float64():
    gen = np.random.default_rng(1)
    logits = random_logits(gen, 64, 40) * 3  # peaked rows: complements near 1e-9
    temperature = torch.rand(64) + 0.2
    # float64, by sorting: log q/(1-q) = -(logsumexp of every logit but the first max - max).
    x = (logits.double() / temperature.double().view(-1, 1)).sort(-1, descending=True).values
    ref = -(torch.logsumexp(x[:, 1:], -1) - x[:, 0])
    ours = max_log_odds(logits, temperature).double()
    torch.testing.assert_close(ours, ref.clamp(-40, 40), rtol=1e-5, atol=1e-5)
    assert (ref > 15).any(), "no peaked row: the float32 cancellation case was not exercised"
    # A one-hot row (complement underflows to 0) saturates at the clamp, never inf.
    onehot = torch.tensor([[0.0, -1e4, -1e4]])
    assert float(max_log_odds(onehot, torch.ones(1))) == 40.0
