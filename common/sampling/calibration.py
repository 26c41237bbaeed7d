"""Per-position temperature scaling of the confidence head (STS calibration).

The head outputs c_k = sigmoid(z_k). Calibration fits one temperature T_k per draft slot on
held-out data (`python -m train.calibrate`) and serving uses c'_k = sigmoid(z_k / T_k), which
keeps the order of confidences within a slot and fixes their scale, the thing the adaptive
scheduler's survival products are sensitive to. Stored beside the checkpoint as
`confidence_calibration.json`; vLLM ignores the file, our engine reads it when present.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CALIBRATION_NAME = "confidence_calibration.json"


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
