"""Pretraining loop for the tiny target: packed blocks, AdamW, warmup + cosine, a step budget or a
quality target under a time cap.

Design choices:
- Documents (rendered chat rows, raw corpus files) are tokenized, each followed by `<|endoftext|>`,
  concatenated and cut into `seq_len` blocks; attention is plain causal across document boundaries.
- A pass is every chat block plus raw-text blocks (see `BlockStream`), shuffled.
- The LR schedule reads progress = step / steps (step budget: bit-identical rebuilds on one CPU) or,
  for a time budget, the larger of elapsed / budget and step / epoch-cap steps: a fast device
  stops at `preset.max_epochs` of unique tokens instead of memorising the small corpus.
- `quality` (a held-out loss function and its target): checked every `preset.check_every` steps,
  training stops once the loss is at or under the target ("quality"). The result then holds on a
  busy machine too: a slow machine trains longer instead of stopping at a fixed time with a
  degenerate model. Under a time cap the LR schedule follows the cap, so a stop at quality keeps
  a higher LR than a full run would end with; the loss check is what is promised.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from train.tiny_target.presets import Preset


def pack(docs: Sequence[Sequence[int]], seq_len: int) -> torch.Tensor:
    """Concatenate token docs and cut into full blocks (the ragged tail is dropped). [N, seq_len]"""
    flat = np.fromiter((t for d in docs for t in d), dtype=np.int64)
    n = len(flat) // seq_len
    return torch.from_numpy(flat[: n * seq_len].copy()).view(n, seq_len)


class BlockStream:
    """Endless batches, shuffled by a seeded generator (the only randomness in data order).

    A pass is every chat block plus raw blocks: all of them (`chat_fraction=None`, natural mix)
    or a fresh random subset sized so chat blocks are `chat_fraction` of the pass.
    """

    def __init__(
        self,
        chat: torch.Tensor,
        raw: torch.Tensor,
        batch_size: int,
        seed: int,
        chat_fraction: float | None = None,
    ):
        if len(chat) + len(raw) < batch_size:
            raise ValueError(f"only {len(chat) + len(raw)} blocks for batch_size {batch_size}")
        self.chat, self.raw, self.batch_size = chat, raw, batch_size
        self.chat_fraction = chat_fraction
        self.gen = torch.Generator().manual_seed(seed)
        self.queue: list[torch.Tensor] = []

    @property
    def unique_blocks(self) -> int:
        return len(self.chat) + len(self.raw)

    def _refill(self) -> None:
        n_raw = len(self.raw)
        if self.chat_fraction is not None:
            want = round(len(self.chat) * (1 - self.chat_fraction) / self.chat_fraction)
            n_raw = min(n_raw, max(want, self.batch_size))
        raw = self.raw[torch.randperm(len(self.raw), generator=self.gen)[:n_raw]]
        epoch = torch.cat([self.chat, raw])
        self.queue += list(epoch[torch.randperm(len(epoch), generator=self.gen)])

    def next_batch(self) -> torch.Tensor:
        """[batch_size, seq_len] int64 token ids."""
        while len(self.queue) < self.batch_size:
            self._refill()
        batch, self.queue = self.queue[: self.batch_size], self.queue[self.batch_size :]
        return torch.stack(batch)


def lr_factor(step: int, progress: float, warmup: int, min_ratio: float) -> float:
    """Linear warmup over `warmup` steps, times cosine decay to `min_ratio` over progress 0..1."""
    p = min(1.0, max(0.0, progress))
    cosine = min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    return min(1.0, (step + 1) / max(1, warmup)) * cosine


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast context on `device` (weights and optimizer state stay fp32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


@dataclass
class TrainResult:
    """`loss_last` is the mean of the last min(10, steps) step losses; `loss_curve` holds
    (step, loss) at most ~200 points."""

    steps: int
    tokens: int
    seconds: float
    loss_first: float
    loss_last: float
    stopped_by: str = ""  # "steps" | "time" | "max_epochs" | "quality"
    loss_curve: list[list] = field(default_factory=list)
    checks: list[list] = field(default_factory=list)  # (step, held-out check loss)


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (linear, embedding); not norms (1-D), as usual for transformer LMs."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def train(
    model: torch.nn.Module,
    stream: BlockStream,
    preset: Preset,
    *,
    steps: int | None,
    minutes: float | None,
    device: torch.device,
    bf16: bool,
    compile_model: bool = False,
    quality: tuple[Callable[[], float], float] | None = None,
) -> TrainResult:
    """Train in place until `steps` optimizer steps, or (steps=None) until `minutes` of wall clock;
    with `quality` = (loss function, target), also stop once the loss is <= target (checked every
    `preset.check_every` steps).

    The time budget is checked before each step using the last step's duration, so the loop ends
    within ~one step of the budget rather than one step after it.
    """
    if (steps is None) == (minutes is None):
        raise ValueError("give exactly one of steps / minutes")
    budget = None if minutes is None else minutes * 60.0
    cap_steps = None  # epoch cap, time budgets only: an explicit step count is obeyed as given
    if steps is None and preset.max_epochs is not None:
        cap_steps = max(1, math.ceil(preset.max_epochs * stream.unique_blocks / preset.batch_size))
    warmup = preset.warmup_steps if steps is None else min(preset.warmup_steps, max(1, steps // 10))
    opt = torch.optim.AdamW(
        _param_groups(model, preset.weight_decay),
        lr=preset.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    fwd = torch.compile(model) if compile_model else model
    model.train()
    losses: list[float] = []
    t0, last_dt, step, tokens = time.monotonic(), 0.0, 0, 0
    checks: list[list] = []
    bar = tqdm(total=steps, desc="train", unit="step", mininterval=1.0, dynamic_ncols=True)
    while True:
        elapsed = time.monotonic() - t0
        if steps is not None and step >= steps:
            stopped_by = "steps"
            break
        if quality is not None and step > 0 and step % preset.check_every == 0:
            loss_fn, want = quality
            checks.append([step, round(loss_fn(), 4)])
            bar.set_postfix(heldout=f"{checks[-1][1]:.3f}", target=f"{want:.2f}", refresh=True)
            if checks[-1][1] <= want:
                stopped_by = "quality"
                break
            elapsed = time.monotonic() - t0  # the time cap counts the checks too
        if budget is not None and step > 0 and elapsed + last_dt > budget:
            stopped_by = "time"
            break
        if cap_steps is not None and step >= cap_steps:
            stopped_by = "max_epochs"
            break
        if steps is not None:
            progress = step / steps
        else:
            progress = max(elapsed / budget, step / cap_steps if cap_steps else 0.0)
        lr = preset.lr * lr_factor(step, progress, warmup, preset.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        ts = time.monotonic()
        batch = stream.next_batch().to(device, non_blocking=True)  # [B, T]
        with autocast(device, bf16):
            loss = fwd(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), preset.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # also syncs, so last_dt is the real step time on GPU
        last_dt = time.monotonic() - ts
        step, tokens = step + 1, tokens + batch.numel()
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr:.2e}", refresh=False)
    bar.close()
    if not losses:
        raise RuntimeError("no training step ran; raise --minutes or --steps")
    stride = max(1, len(losses) // 200)
    return TrainResult(
        steps=step,
        tokens=tokens,
        seconds=time.monotonic() - t0,
        loss_first=losses[0],
        loss_last=float(np.mean(losses[-10:])),
        stopped_by=stopped_by,
        loss_curve=[[i, round(v, 4)] for i, v in enumerate(losses) if i % stride == 0],
        checks=checks,
    )
