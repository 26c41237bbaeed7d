"""Keyed (counter-based) Gumbel-max sampling.

Design choices:
- Noise is a pure function of (seed, stream, position, column): a splitmix64-style integer hash in
  int64 torch ops (wrapping multiplication, logical shifts emulated with masks). A draw is therefore
  reproducible across runs, devices and batch compositions, and needs no generator state, so a
  sampling step can be captured in a CUDA graph.
- Callers key a draw that produces the token at position P by P - 1 (the predecessor's position),
  as vLLM's DSpark speculator does. Draft, verification-accept and target/residual draws use
  different `Stream`s, so they are independent even at the same (seed, position).
- Columns are keyed by *target* vocab id wherever the caller knows it (`cols=`), so a reduced-vocab
  or top-k row draws the same noise for a token as the full-vocab row would.
- Temperature <= 0 means greedy: argmax of the raw logits, first maximum on ties.
"""

from __future__ import annotations

from enum import IntEnum

import torch

# splitmix64 constants as wrapped (two's complement) int64 values.
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)


class Stream(IntEnum):
    """Independent random streams sharing one per-request seed."""

    DRAFT = 1  # draft-token Gumbel noise (Markov walk)
    ACCEPT = 2  # rejection-sampling accept uniforms
    TARGET = 3  # residual / bonus / plain target sampling


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 tensors (bit-identical to the uint64 reference `mix64_int`)."""
    return mix64_(x.clone())


def mix64_(x: torch.Tensor) -> torch.Tensor:
    """In-place `mix64` with one scratch buffer: at vocab 151,936 x batch 64 every out-of-place
    int64 temporary is a fresh 78 MB allocation, which dominated the CPU runtime."""
    t = torch.empty_like(x)
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        torch.bitwise_right_shift(x, shift, out=t)
        t &= (1 << (64 - shift)) - 1
        x ^= t
        if mult is not None:
            x.mul_(mult)
    return x


def mix64_int(x: int) -> int:
    """Reference splitmix64 finaliser on a Python int (unsigned 64-bit arithmetic)."""
    mask = (1 << 64) - 1
    x &= mask
    x ^= x >> 30
    x = (x * (_M1 & mask)) & mask
    x ^= x >> 27
    x = (x * (_M2 & mask)) & mask
    return x ^ (x >> 31)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def row_keys(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """Per-row int64 key from (seed, stream, position); [R] -> [R]."""
    salt = _signed(mix64_int(int(stream) * (_GOLDEN & ((1 << 64) - 1))))
    k = mix64(seeds.long() ^ salt)
    return mix64(k + positions.long() * _GOLDEN)


def keyed_bits(
    seeds: torch.Tensor, positions: torch.Tensor, cols: torch.Tensor, stream: int
) -> torch.Tensor:
    """64 hashed bits per (row, column).

    Args:
        seeds, positions: [R] int64.
        cols: [C] (shared) or [R, C] int64 column keys.
    Returns:
        [R, C] int64.
    """
    k = row_keys(seeds, positions, stream).unsqueeze(1)  # [R, 1]
    x = cols.long() * _M1  # [C] or [R, C]
    x = x + k if x.dim() == 1 else x.add_(k)  # broadcast to [R, C]
    return mix64_(x)


def keyed_uniform(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    cols: torch.Tensor,
    stream: int,
    fp64: bool = False,
) -> torch.Tensor:
    """Uniforms strictly inside (0, 1), exactly representable; [R, C] (float32 or float64)."""
    bits = keyed_bits(seeds, positions, cols, stream)
    shift = 12 if fp64 else 41  # 23 bits keep (m + 0.5) exact in float32's 24-bit significand
    bits >>= shift
    bits &= (1 << (64 - shift)) - 1
    u = bits.to(torch.float64 if fp64 else torch.float32)
    return u.add_(0.5).mul_(2.0 ** -(64 - shift))


def gumbel_noise(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    cols: torch.Tensor,
    stream: int,
    fp64: bool = False,
) -> torch.Tensor:
    """Standard Gumbel noise -log(-log(u)); [R, C]."""
    u = keyed_uniform(seeds, positions, cols, stream, fp64)
    return u.log_().neg_().log_().neg_()


def sampled_probs(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """The distribution `gumbel_sample` draws from: softmax(logits / T), or one-hot argmax at T<=0.

    Args:
        logits: [R, C] (any float dtype; -inf allowed except a whole row).
        temperature: [R].
    Returns:
        [R, C] float32 probabilities.
    """
    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    probs = torch.softmax(logits / t.unsqueeze(1), dim=-1)
    one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy.unsqueeze(1), one_hot, probs)


def gumbel_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    stream: int = Stream.DRAFT,
    cols: torch.Tensor | None = None,
    fp64: bool = False,
) -> torch.Tensor:
    """Sample one column per row: argmax(logits / T + g(seed, stream, position, col)).

    Args:
        logits: [R, C].
        temperature: [R] float; <= 0 selects greedy argmax.
        seeds: [R] int64 per-request seeds.
        positions: [R] int64 key positions (the predecessor's position, P - 1).
        stream: which independent stream to draw from.
        cols: [C] or [R, C] int64 noise keys of the columns; default arange(C).
        fp64: draw noise from 52-bit uniforms in float64.
    Returns:
        [R] int64 column indices into `logits`.
    """
    if cols is None:
        cols = torch.arange(logits.shape[-1], device=logits.device)
    noise = gumbel_noise(seeds, positions, cols, stream, fp64)  # [R, C]
    greedy = (temperature <= 0).unsqueeze(1)  # [R, 1]
    # Every row gets noise so shapes stay static; greedy rows zero it and keep T = 1.
    noise.masked_fill_(greedy, 0.0)
    t = torch.where(greedy, 1.0, temperature.unsqueeze(1)).to(noise.dtype)
    scores = logits.to(noise.dtype).div(t).add_(noise)
    return scores.argmax(-1)


def categorical_from_probs(
    probs: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    stream: int = Stream.TARGET,
    fp64: bool = False,
) -> torch.Tensor:
    """Keyed sample from unnormalised non-negative weights [R, C] -> [R] (Gumbel-max on log w).

    Gumbel-max is invariant to a per-row scale, so weights need not sum to one (e.g. a residual
    max(0, p_t - p_d)); a zero weight is never drawn.
    """
    ones = torch.ones(probs.shape[0], device=probs.device)
    logw = torch.log(probs.double() if fp64 else probs.float())
    return gumbel_sample(logw, ones, seeds, positions, stream=stream, fp64=fp64)
