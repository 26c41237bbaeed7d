"""DSpark heads: the low-rank Markov head (vanilla / gated / rnn) and the confidence head.

Every Markov variant is written as `bias_k = markov_w2(u_k)` where `u_k` ([.., r]) is the head's
"bias input" at slot k; only how `u_k` is made differs:
- vanilla: u = e,                      e = markov_w1[x_{k-1}] (target id of the previous token)
- gated:   u = sigmoid(W_g [h_k; e]) * e
- rnn:     z = [s_{k-1}; e; h_k] -> (g, c, o) = split(W_z z);
           s_k = sig(g) s_{k-1} + (1-sig(g)) tanh(c); u = tanh(o); s_0 = 0
This lets the loss fuse `lm_head(h) + markov_w2(u)` into one matmul over `[h; u]`, and the serving
loop call `markov_step` without knowing the variant. Stock vLLM serves only vanilla.

Adding a head type touches:
1. `common.config.MARKOV_HEAD_TYPES` (the schema's choices, the bench scripts' options and the
   tests' parametrizations read it; `VLLM_MARKOV_HEAD_TYPES` only if stock vLLM builds it);
2. `MarkovHead.__init__` (its layers, inside the head so `train.loop.optim_groups` gives them the
   head's rate) and `MarkovHead.step` (how `u_k` is made; a state threads through the slots);
3. `common.checkpoint_files.SPECULATORS_RENAMES` where `speculators` names its layers otherwise.
The lossless-sampling, training-equivalence and optimizer-group tests then cover it unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.config import DSparkConfig


class MarkovHead(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        r, h = cfg.markov_rank, cfg.hidden_size
        self.kind, self.rank = cfg.markov_head_type, r
        self.markov_w1 = nn.Embedding(cfg.vocab_size, r)
        self.markov_w2 = nn.Linear(r, cfg.draft_vocab, bias=False)
        if self.kind == "gated":
            self.markov_gate = nn.Linear(h + r, r)
        elif self.kind == "rnn":
            self.markov_rnn = nn.Linear(2 * r + h, 3 * r)

    def embed(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """[...] target ids -> [..., r]."""
        return self.markov_w1(prev_ids)

    def step(
        self, e: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One slot: (e [.., r], h [.., H], state [.., r] | None) -> (u [.., r], new state)."""
        if self.kind == "vanilla":
            return e, state
        if self.kind == "gated":
            g = torch.sigmoid(self.markov_gate(torch.cat([h.to(e.dtype), e], dim=-1)))
            return g * e, state
        s = torch.zeros_like(e) if state is None else state
        g, c, o = self.markov_rnn(torch.cat([s, e, h.to(e.dtype)], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(g)
        s = g * s + (1 - g) * torch.tanh(c)
        return torch.tanh(o), s

    def teacher_forced(
        self, prev_ids: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """All slots at once. prev_ids: [..., N], h: [..., N, H] -> (e, u), each [..., N, r].

        Only the rnn variant loops, over the N <= block_size slots (never over anchors).
        """
        e = self.embed(prev_ids)
        if self.kind != "rnn":
            return e, self.step(e, h, None)[0]
        us, state = [], None
        for k in range(prev_ids.shape[-1]):
            u, state = self.step(e[..., k, :], h[..., k, :], state)
            us.append(u)
        return e, torch.stack(us, dim=-2)


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(w . [h_k ; e_k] + b); fp32 parameters, as vLLM builds it."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.with_markov = cfg.confidence_head_with_markov
        self.proj = nn.Linear(cfg.confidence_input_size, 1, bias=True, dtype=torch.float32)

    def logits(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """[..., H], [..., r] -> [...] pre-sigmoid, fp32 (fp64 for a float64 model)."""
        x = torch.cat([h, e.to(h.dtype)], dim=-1) if self.with_markov else h
        # Compute in (at least) fp32 whatever dtype a blanket `model.to(dtype)` left on proj.
        ct = torch.promote_types(self.proj.weight.dtype, torch.float32)
        w, b = self.proj.weight.to(ct), self.proj.bias.to(ct)
        return F.linear(x.to(ct), w, b).squeeze(-1)
