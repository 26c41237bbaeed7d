"""Adaptive verification (DSpark paper, Algorithm 1): choose how many drafts of each request the
target verifies, from the confidence head's per-slot accept estimates.

- Survival a_{r,j} = prod_{i<=j} c_{r,i}: the estimated probability that draft j of request r is
  accepted, i.e. its expected contribution to the tokens emitted.
- Expected tokens tau = R + sum of admitted a (every request emits its correction/bonus token);
  cost is the target step rate SPS(R + n) for n admitted drafts (R + n tokens verified);
  throughput Theta = tau * SPS(R + n).
- All (r, j) sorted by a descending (stable: ties keep (r, j) order, and a is non-increasing in
  j, so every admitted set is a union of per-request prefixes); admit while Theta strictly
  improves and STOP at the first non-improvement. A global search over the sequence would let a
  later draft's confidence decide whether an earlier one is verified, which biases the output;
  the stopping rule keeps the decision for draft j a function of slots <= j only.
- When Theta_n = (R + S_n) * SPS(R + n) is unimodal in n (e.g. SPS = 1 / latency with latency
  positive and convex in the batch size: then Theta_n is concave-over-convex, hence quasi-concave),
  the first non-improvement is the global optimum over all prefix-length vectors.
- No confidence head (or no table): verify every draft.

SPS is either an `SPSTable` by token count (R + n, the paper's model) or the embedded engine's
`PaddedCostTable`: the engine verifies a dense [R, q] batch, q = 1 + the longest admitted
prefix, so after m admissions SPS = 1000 / (draft_ms[R] + verify_ms[R][q_m]), the batch it will
actually run. vLLM 0.34 does not run this algorithm: see `draft_budget` for what it runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.sampling.draft_budget import PaddedCostTable


@dataclass
class SPSTable:
    """Target steps per second as a function of the number of tokens verified in one step.

    Lookup interpolates linearly between profiled sizes, holds the first value below the range,
    and above it assumes a constant token rate (sps_last * size_last / n).
    """

    sizes: list[int]
    sps: list[float]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if len(self.sizes) != len(self.sps) or not self.sizes:
            raise ValueError("SPSTable needs equally many (>= 1) sizes and sps values")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:])):
            raise ValueError(f"SPSTable sizes must be strictly increasing, got {self.sizes}")
        if any(s <= 0 for s in self.sps):
            raise ValueError("SPSTable sps values must be positive")

    def __call__(self, n: torch.Tensor | int | float) -> torch.Tensor:
        """SPS at token counts `n` (any shape) -> float64 tensor of the same shape."""
        n = torch.as_tensor(n, dtype=torch.float64)
        xp = torch.tensor(self.sizes, dtype=torch.float64, device=n.device)
        fp = torch.tensor(self.sps, dtype=torch.float64, device=n.device)
        i = torch.searchsorted(xp, n.contiguous(), right=True).clamp(1, len(xp) - 1)
        x0, x1, f0, f1 = xp[i - 1], xp[i], fp[i - 1], fp[i]
        w = ((n - x0) / (x1 - x0).clamp(min=1e-12)).clamp(0.0, 1.0)
        inside = f0 + w * (f1 - f0)
        above = fp[-1] * xp[-1] / n.clamp(min=1.0)
        return torch.where(n > xp[-1], above, inside)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps({"sizes": self.sizes, "sps": self.sps, "meta": self.meta}, indent=1)
        )

    @classmethod
    def load(cls, path: str | Path) -> SPSTable:
        d = json.loads(Path(path).read_text())
        return cls([int(s) for s in d["sizes"]], [float(v) for v in d["sps"]], d.get("meta", {}))


@dataclass
class VerifyPlan:
    """verify_len: [R] int64 drafts to verify; theta: estimated tokens/s; num_tokens: R + n."""

    verify_len: torch.Tensor
    theta: float
    num_tokens: int


def padded_sps(order: torch.Tensor, num_reqs: int, num_drafts: int, table: PaddedCostTable):
    """[R*N + 1] steps/s after each admission in `order` (flat r * N + j), priced on the padded
    [R, 1 + longest admitted prefix] verify batch plus the draft step."""
    onehot = torch.nn.functional.one_hot(order // num_drafts, num_reqs)  # [R*N, R]
    counts = torch.cat([onehot.new_zeros(1, num_reqs), onehot.cumsum(0)])  # [R*N + 1, R]
    longest = counts.max(1).values
    return 1000.0 / table.step_costs(num_reqs, longest).to(order.device)


def theta_curve(confidence: torch.Tensor, sps: SPSTable | PaddedCostTable):
    """Sorted admission order and Theta after each admission.

    Returns:
        order: [R*N] flat (r * N + j) indices by survival, descending (stable).
        theta: [R*N + 1] float64; theta[m] = Theta with the first m items admitted.
    """
    R, N = confidence.shape
    a = torch.cumprod(confidence.double().clamp(0.0, 1.0), dim=1).flatten()  # [R*N]
    order = torch.sort(a, descending=True, stable=True).indices
    s = torch.cat([a.new_zeros(1), torch.cumsum(a[order], 0)])  # [R*N + 1]
    if isinstance(sps, PaddedCostTable):
        return order, (R + s) * padded_sps(order, R, N, sps)
    m = torch.arange(R * N + 1, dtype=torch.float64, device=a.device)
    return order, (R + s) * sps(R + m).to(a.device)


def plan_verify_lengths(
    confidence: torch.Tensor | None,
    sps: SPSTable | PaddedCostTable | None,
    num_reqs: int | None = None,
    num_drafts: int | None = None,
) -> VerifyPlan:
    """Per-request verify lengths by greedy admission with stop-at-first-non-improvement.

    Args:
        confidence: [R, N] per-slot accept estimates c in [0, 1], or None (no confidence head).
        sps: steps/s by token count, the engine's padded cost table, or None (not profiled).
        num_reqs, num_drafts: R and N, needed only when confidence is None.
    Returns:
        VerifyPlan; without confidence or table every request verifies all N drafts (theta NaN).
    """
    if confidence is None or sps is None:
        R = confidence.shape[0] if confidence is not None else num_reqs
        N = confidence.shape[1] if confidence is not None else num_drafts
        if R is None or N is None:
            raise ValueError("plan_verify_lengths: give num_reqs and num_drafts without confidence")
        device = confidence.device if confidence is not None else None
        full = torch.full((R,), N, dtype=torch.long, device=device)
        return VerifyPlan(full, float("nan"), R * (N + 1))
    R, N = confidence.shape
    order, theta = theta_curve(confidence, sps)
    improve = theta[1:] > theta[:-1]  # [R*N]
    admit_sorted = torch.cumprod(improve.long(), 0).bool()  # admitted until the first False
    admit = torch.zeros(R * N, dtype=torch.bool, device=order.device)
    admit[order] = admit_sorted
    verify_len = admit.view(R, N).sum(1)
    count = int(admit_sorted.sum())
    return VerifyPlan(verify_len.to(confidence.device), float(theta[count]), R + count)
