"""Qwen3-style draft layers with KV injection (DFlash backbone).

Every draft layer attends from block queries to `[context K/V ; block K/V]`:
- context K/V come from the fused target context `c = hidden_norm(fc(ctx))` through this layer's
  own `k_proj`/`v_proj` (no input layernorm: vLLM projects the normed context directly), then
  `k_norm` and RoPE at the context positions;
- block Q/K/V come from the layer's normed input, `q_norm`/`k_norm`, RoPE at the block positions.
The rotary angles are the same for every layer: the model computes them once per forward
(`rotary`) and hands them to each layer (in float64 per layer they were 7% of the GPU time of a
SmolLM2-shape training step, 2026-12-05 profile).
Which keys a query may see is decided by a boolean mask built by the caller (`common.model.masks`).
Parameter names follow HF Qwen3 so checkpoints need no key mapping.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from common.config import DSparkConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in (at least) fp32 as HF/vLLM do, return in the input dtype. fp64 stays fp64
        # so float64 reference tests compare the real computation, not an fp32 round trip.
        ct = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(ct)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(ct) * xf).to(x.dtype)


class Rotary(NamedTuple):
    """Neox-style rotary cos/sin at some positions, [..., S, 1, hd/2] each, in the compute dtype."""

    cos: torch.Tensor
    sin: torch.Tensor


def rotary(pos: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> Rotary:
    """Angles in float64, cos/sin in the dtype `apply_rope` computes in for inputs of `dtype`:
    fp32 for fp32/bf16/fp16, fp64 for fp64. pos: [..., S] (int)."""
    exps = torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float64) / head_dim
    inv = 1.0 / (theta**exps)
    ang = (pos.to(torch.float64).unsqueeze(-1) * inv).unsqueeze(-2)  # [..., S, 1, hd/2]
    ct = torch.promote_types(dtype, torch.float32)
    return Rotary(ang.cos().to(ct), ang.sin().to(ct))


def apply_rope(x: torch.Tensor, rot: Rotary) -> torch.Tensor:
    """x: [..., S, heads, hd] rotated by `rot` (from `rotary` for x's dtype)."""
    hd = x.shape[-1]
    xf = x.to(rot.cos.dtype)
    x1, x2 = xf[..., : hd // 2], xf[..., hd // 2 :]
    out = torch.cat([x1 * rot.cos - x2 * rot.sin, x2 * rot.cos + x1 * rot.sin], dim=-1)
    return out.to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding. x: [..., S, heads, hd], pos: [..., S] (int)."""
    return apply_rope(x, rotary(pos, x.shape[-1], theta, x.dtype))


_compiled_flex = None


def flex_block_attention(q, k, v, block_mask):
    """q [N, nh, Q, hd], k/v [N, nkv, K, hd] under a `BlockMask` (GQA without repeating K/V).
    Compiled on CUDA (flex attention's fused kernel); eager elsewhere (its reference math)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if not q.is_cuda:
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])


class DraftAttention(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, rot: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values. x: [N, S, H] -> ([N, S, nkv, hd], [N, S, nkv, hd])."""
        n, s, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(n, s, self.nkv, self.hd))
        v = self.v_proj(x).view(n, s, self.nkv, self.hd)
        return apply_rope(k, rot), v

    def forward(
        self,
        x: torch.Tensor,  # [N, Q, H] normed block input
        rot: Rotary,  # at the block positions [N, Q]
        ctx_kv: tuple[torch.Tensor, torch.Tensor],  # 2 x [N, C, nkv, hd]
        mask: torch.Tensor,  # [N, Q, C+Q] bool, True = may attend
    ) -> torch.Tensor:
        n, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(n, q_len, self.nh, self.hd))
        q = apply_rope(q, rot)
        k_blk, v_blk = self.kv(x, rot)
        k = torch.cat([ctx_kv[0], k_blk], dim=1).transpose(1, 2)  # [N, nkv, C+Q, hd]
        v = torch.cat([ctx_kv[1], v_blk], dim=1).transpose(1, 2)
        if not isinstance(mask, torch.Tensor):  # a flex-attention BlockMask (masks.py)
            out = flex_block_attention(q.transpose(1, 2), k, v, mask)
            return self.o_proj(out.transpose(1, 2).reshape(n, q_len, self.nh * self.hd))
        rep = self.nh // self.nkv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask.unsqueeze(1))
        return self.o_proj(out.transpose(1, 2).reshape(n, q_len, self.nh * self.hd))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, rot, ctx_kv, mask):
        x = x + self.self_attn(self.input_layernorm(x), rot, ctx_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
