"""Per-position temperature scaling of the confidence head (STS calibration).

The head outputs c_k = sigmoid(z_k). Calibration fits one temperature T_k per draft slot on
held-out data (`python -m train.publish.calibrate`) and serving uses c'_k = sigmoid(z_k / T_k),
which
keeps the order of confidences within a slot and fixes their scale, the thing the adaptive
scheduler's survival products are sensitive to.

Objective (the paper's, `fit_sequential_temperatures`): the scheduler consumes survivals
s_k = prod_{i<=k} sigmoid(z_i / T_i), the estimated probability that drafts 0..k are all
accepted, so the temperatures jointly minimise the BCE (the Bernoulli NLL) of s_k against
y_k = prod_{i<=k} (1 - TV_i), the probability that the prefix up to k is accepted (the expected
value of the 0/1 prefix-accepted outcome), over every valid (block, k). `fit_temperature` is
the older per-slot fit (BCE of sigmoid(z_k / T_k) against 1 - TV_k alone).

Where the temperatures live: vLLM 0.34 reads none (its DSpark model computes
sigmoid(confidence_head.proj(x)) and no config key scales it), so `confidence_calibration.json`
beside the checkpoint is read by the embedded engine only. What vLLM does read is the head's
weights: one SHARED temperature folds exactly into them (w / T, b / T; `fold_temperature`), and
the file then keeps the per-slot remainder T_k / T for the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CALIBRATION_NAME = "confidence_calibration.json"
# model.safetensors metadata key `train.publish.calibrate --fold-into-weights` writes: the shared
# temperature folded into the confidence head's weights (what vLLM serves).
FOLDED_TEMPERATURE_KEY = "dspark_folded_confidence_temperature"


def apply_temperatures(confidence: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """confidence [R, N] in (0, 1), temperatures [>= N] -> sigmoid(logit(c) / T_k) [R, N]."""
    c = confidence.float().clamp(1e-6, 1 - 1e-6)
    t = temperatures[: c.shape[-1]].to(c.device, torch.float32)
    return torch.sigmoid(torch.logit(c) / t)


def load_temperatures(ckpt_dir: str | Path) -> torch.Tensor | None:
    """[N] temperatures from CKPT/confidence_calibration.json, or None if not calibrated."""
    path = Path(ckpt_dir) / CALIBRATION_NAME
    if not path.is_file():
        return None
    temps = json.loads(path.read_text())["temperatures"]
    if not temps or any(t <= 0 for t in temps):
        raise ValueError(f"{path}: temperatures must be positive, got {temps}")
    return torch.tensor(temps, dtype=torch.float32)


def folded_temperature(weights_file: str | Path) -> float | None:
    """The temperature folded into the confidence head of `weights_file` (a safetensors file), from
    its metadata; None when none was folded (the head is served raw by vLLM)."""
    from safetensors import safe_open

    with safe_open(str(weights_file), "pt") as f:
        value = (f.metadata() or {}).get(FOLDED_TEMPERATURE_KEY)
    return None if value is None else float(value)


def expected_calibration_error(conf: torch.Tensor, target: torch.Tensor, bins: int = 15) -> float:
    """ECE of predictions `conf` [M] against (soft) outcomes `target` [M]: sum over equal-width
    bins of (bin share) * |mean conf - mean target|."""
    if conf.numel() == 0:
        return float("nan")
    idx = (conf.clamp(0, 1 - 1e-9) * bins).long()
    ece = conf.new_zeros(())
    for b in range(bins):
        m = idx == b
        if m.any():
            ece += m.float().mean() * (conf[m].mean() - target[m].mean()).abs()
    return float(ece)


def fit_temperature(logits: torch.Tensor, target: torch.Tensor) -> float:
    """T > 0 minimising BCE(sigmoid(logits / T), target): a log-spaced grid, then a refinement
    around the best point (1-D, convex in 1/T, so the grid cannot miss the basin)."""
    logits, target = logits.double(), target.double()

    def bce(t: torch.Tensor) -> torch.Tensor:  # t: [G] -> [G]
        z = logits.unsqueeze(0) / t.unsqueeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(
            z, target.expand_as(z), reduction="none"
        ).mean(1)

    grid = torch.logspace(-2, 2, 401, dtype=torch.float64)
    best = grid[bce(grid).argmin()]
    fine = best * torch.logspace(-0.02, 0.02, 201, dtype=torch.float64)
    return float(fine[bce(fine).argmin()])


def survival_bce(z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, t: torch.Tensor):
    """Mean BCE of survivals against prefix-accept labels over valid (block, k).

    z: [M, N] head logits; y: [M, N] prefix-accept probabilities (or 0/1 outcomes); mask:
    [M, N] bool; t: [N] temperatures. Survival in log space: log s_k = sum_{i<=k} logsig(z_i/T_i).
    """
    log_s = torch.cumsum(torch.nn.functional.logsigmoid(z / t), dim=1)
    log_1ms = torch.log((-torch.expm1(log_s)).clamp(min=1e-300))  # log(1 - s), stable near s = 1
    nll = -(y * log_s + (1 - y) * log_1ms)
    return nll[mask].mean()


def prefix_accept(acc: torch.Tensor) -> torch.Tensor:
    """[M, N] per-slot acceptance 1 - TV_k -> [M, N] prefix acceptance prod_{i<=k}."""
    return torch.cumprod(acc.double(), dim=1)


def fit_sequential_temperatures(
    z: torch.Tensor, acc: torch.Tensor, mask: torch.Tensor, shared: bool = False
) -> torch.Tensor:
    """[N] temperatures minimising `survival_bce` (the paper's sequential STS objective).

    acc: [M, N] per-slot acceptance 1 - TV_k; mask: [M, N] bool, a prefix mask per block (a slot
    is valid only if every earlier slot is). `shared`: one temperature for all slots (the one
    that folds into vLLM's head weights): a 1-D log grid then a refinement. Per-slot: L-BFGS on
    log T in float64 from T = 1 (the survival of slot k depends on T_0..T_k jointly).
    """
    z, y = z.double(), prefix_accept(acc)
    n = z.shape[1]
    if not mask.any():
        return torch.ones(n, dtype=torch.float64)
    if shared:

        def loss_at(grid: torch.Tensor) -> torch.Tensor:
            return torch.stack([survival_bce(z, y, mask, g.expand(n)) for g in grid])

        grid = torch.logspace(-2, 2, 161, dtype=torch.float64)
        best = grid[loss_at(grid).argmin()]
        fine = best * torch.logspace(-0.03, 0.03, 61, dtype=torch.float64)
        return fine[loss_at(fine).argmin()].expand(n).clone()
    log_t = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = survival_bce(z, y, mask, log_t.exp())
        loss.backward()
        return loss

    opt.step(closure)
    valid = mask.any(0)  # a slot with no valid sample keeps T = 1
    return torch.where(valid, log_t.detach().exp(), torch.ones_like(log_t)).clamp(1e-2, 1e2)


def sequential_ece(z, acc, mask, t: torch.Tensor) -> list[float]:
    """Per-slot ECE of survivals s_k (temperatures t) against prefix acceptance y_k."""
    s = torch.exp(torch.cumsum(torch.nn.functional.logsigmoid(z.double() / t.double()), dim=1))
    y = prefix_accept(acc)
    return [
        expected_calibration_error(s[mask[:, k], k], y[mask[:, k], k]) for k in range(z.shape[1])
    ]


def fold_temperature(weight: torch.Tensor, bias: torch.Tensor, t: float):
    """The confidence head's proj (weight [1, D], bias [1]) with the logit divided by `t`:
    sigmoid(proj'(x)) = sigmoid(proj(x) / t) exactly (in the stored dtype)."""
    return (weight.double() / t).to(weight.dtype), (bias.double() / t).to(bias.dtype)
