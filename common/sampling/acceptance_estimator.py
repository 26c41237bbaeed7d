"""Online acceptance estimator: per-slot accept probabilities for a draft WITHOUT a confidence
head, fitted while serving. The semantics of vLLM 0.34's `OnlineAcceptanceEstimator`
(`vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`), in torch ops instead of Triton.

- Feature at slot k: f = logit(max q) = -log(sum_{z != argmax} exp(z - max)) of the distribution
  the slot samples from (draft logits after the Markov bias, divided by the request temperature;
  temperature <= 0 counts as 1), clamped to [-40, 40]. One copy of the max is excluded by
  value, never subtracted (keeps fp32 accuracy when the complement is tiny). It scores the
  distribution, not the drawn token, so trimming stays lossless.
- Prediction p = sigmoid(w * f + b_k): one shared slope w, one intercept per slot; cold start
  w = 0.5, b_k = -0.2.
- After verification, slots k <= accepted and k < verified are observed (label k < accepted):
  their IRLS statistics (X'WX arrowhead entries and X'(y - p)) accumulate; every
  REFIT_INTERVAL steps one ridge-regularised (L2) Newton step solves for (dw, db_k), damped by
  n / (n + DAMPING) (the round's total count for w, the slot's count for b_k); a NaN step or
  one that would make w negative is dropped. Statistics then reset.
All state is float32, as in vLLM.
"""

from __future__ import annotations

import torch

MAX_LOG_ODDS = 40.0
INIT_SLOPE, INIT_BIAS = 0.5, -0.2


def max_log_odds(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """[R, V] logits, [R] temperatures -> [R] float32 logit of the largest probability."""
    temp = temperature.float().view(-1, 1)
    x = logits.float() / torch.where(temp > 0, temp, torch.ones_like(temp))
    m = x.max(dim=-1, keepdim=True).values
    is_max = x == m
    excl = torch.where(is_max, torch.zeros_like(x), torch.exp(x - m)).sum(-1)
    # The other tokens tied for the max; (count - 1) first: excl + count - 1 would round a tiny
    # excl away against 1.0 in float32.
    excl = excl + (is_max.sum(-1).float() - 1.0)
    return (-torch.log(excl)).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS)


class OnlineAcceptanceEstimator:
    """Per-slot acceptance predictions for `num_steps` drafts of up to `max_num_reqs` slots."""

    REFIT_INTERVAL = 100
    DAMPING_OBSERVATIONS = 50.0
    L2 = 1e-3

    def __init__(self, max_num_reqs: int, num_steps: int, device: torch.device | str = "cpu"):
        f32 = {"dtype": torch.float32, "device": device}
        self.num_steps = num_steps
        self.slope = torch.full((1,), INIT_SLOPE, **f32)
        self.intercepts = torch.full((num_steps,), INIT_BIAS, **f32)
        self.features = torch.zeros(max_num_reqs, num_steps, **f32)
        self.predictions = torch.zeros(max_num_reqs, num_steps, **f32)
        self.info = torch.zeros(num_steps, 3, **f32)  # per slot: a_k, b_k, c_k
        self.grad = torch.zeros(num_steps, 2, **f32)  # per slot: g0_k, g1_k
        self.counts = torch.zeros(num_steps, **f32)
        self._steps_since_refit = 0

    def predict(
        self, logits: torch.Tensor, rows: torch.Tensor, step: int, temperature: torch.Tensor
    ) -> torch.Tensor:
        """Slot `step`'s sampled-from logits [R, V] of request slots `rows` [R] -> [R] p."""
        f = max_log_odds(logits, temperature)
        p = torch.sigmoid(self.slope * f + self.intercepts[step])
        self.features[rows, step] = f
        self.predictions[rows, step] = p
        return p

    def step(self, rows: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor):
        """Fold one verification in: num_sampled = accepted + 1 (bonus), num_rejected = verified
        drafts not accepted; refit every REFIT_INTERVAL calls."""
        accepted = (num_sampled.long() - 1).clamp(min=0).view(-1, 1)
        admitted = accepted + num_rejected.long().view(-1, 1)
        k = torch.arange(self.num_steps, device=accepted.device)
        observed = (k <= accepted) & (k < admitted)  # [R, N]
        label = (k < accepted).float()
        f, p = self.features[rows], self.predictions[rows]
        w = torch.where(observed, p * (1.0 - p), torch.zeros_like(p))
        resid = torch.where(observed, label - p, torch.zeros_like(p))
        self.info += torch.stack([(w * f * f).sum(0), (w * f).sum(0), w.sum(0)], dim=1)
        self.grad += torch.stack([(resid * f).sum(0), resid.sum(0)], dim=1)
        self.counts += observed.float().sum(0)
        self._steps_since_refit += 1
        if self._steps_since_refit >= self.REFIT_INTERVAL:
            self._steps_since_refit = 0
            self.refit()

    def refit(self) -> None:
        """One damped ridge Newton step on the arrowhead system, then clear the statistics."""
        a_k, b_k, c_k = self.info.unbind(1)
        c_k = c_k + self.L2
        a = a_k.sum() + self.L2
        g0_k, g1_k = self.grad.unbind(1)
        n = self.counts
        step_w = (g0_k.sum() - (b_k * g1_k / c_k).sum()) / (a - (b_k * b_k / c_k).sum())
        total = n.sum()
        step_w = step_w * total / (total + self.DAMPING_OBSERVATIONS)
        keep = (step_w == step_w) & (self.slope + step_w >= 0.0)
        step_w = torch.where(keep, step_w, torch.zeros_like(step_w))
        step_b = (g1_k - b_k * step_w) / c_k * (n / (n + self.DAMPING_OBSERVATIONS))
        step_b = torch.where(step_b == step_b, step_b, torch.zeros_like(step_b))
        self.slope += step_w
        self.intercepts += step_b
        self.info.zero_()
        self.grad.zero_()
        self.counts.zero_()
