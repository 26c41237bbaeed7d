"""`TargetRunner`: batched target forwards over per-request KV slots.

One method, `forward`, serves prefill, speculative verification and plain decoding: each row r
feeds Q tokens at positions start[r]..start[r]+Q-1 against its slot's cached context and gets
logits at the requested query indices plus (in speculative mode) the captured aux hidden states
of all Q positions -- the draft's context for those positions. Rows with fewer real tokens are
right-padded; the padding writes stale keys beyond the row's valid length, which the mask and
the next write make harmless (see `SlotKVCache`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from common.target import TargetCapture, softcap_logits, target_logit_softcap
from serve.engine.kv_cache import SlotKVCache, attention_mask


@dataclass
class TargetOutput:
    """logits: [R, M, V] (float32, or float64 for a float64 target; soft-capped as the target's
    own forward does) at the requested query indices; aux: [R, Q, L*Ht] captured layers (None in
    target-only mode)."""

    logits: torch.Tensor
    aux: torch.Tensor | None


class TargetRunner:
    def __init__(
        self,
        model: nn.Module,
        layer_ids: list[int] | None,
        slots: int,
        capacity: int,
        kv_bucket: int = 64,
    ):
        self.model = model.eval()
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
        cfg = cfg or model.config
        self.config = cfg
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.capture = TargetCapture(model, layer_ids) if layer_ids else None
        # transformers >= 5.2x calls the cache kwarg `cache`; older 5.x `past_key_values`. An
        # unknown kwarg would be swallowed silently, so pick the one the signature names.
        params = inspect.signature(self.decoder.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # Models with `layer_types` (Qwen2/3, Gemma 3) take one mask per kind as a dict; the
        # others (Llama, Mistral, Phi-3, Mixtral) take one tensor, windowed when the config sets
        # `sliding_window` (their HF forward picks the sliding-window mask function then).
        self.sliding_window = getattr(cfg, "sliding_window", None)
        self.layer_types = list(getattr(cfg, "layer_types", None) or [])
        self._single_mask_kind = None
        if not self.layer_types:
            windowed = self.sliding_window is not None
            self._single_mask_kind = "sliding_attention" if windowed else "full_attention"
            self.layer_types = [self._single_mask_kind]
        self.logit_softcap = target_logit_softcap(cfg)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        p = next(model.parameters())
        self.cache = SlotKVCache(
            cfg.num_hidden_layers,
            slots,
            cfg.num_key_value_heads,
            head_dim,
            capacity,
            p.dtype,
            p.device,
            kv_bucket,
        )
        self.device, self.dtype = p.device, p.dtype
        self._additive = cfg._attn_implementation not in ("sdpa", "flex_attention")

    def _masks(self, start: torch.Tensor, q_len: int, kv_len: int):
        """Per layer type 4D masks (bool for sdpa; additive float for eager attention)."""
        out = {}
        for kind in set(self.layer_types):
            window = self.sliding_window if kind == "sliding_attention" else None
            m = attention_mask(start, q_len, kv_len, window)
            if self._additive:
                m = torch.zeros(m.shape, dtype=self.dtype, device=m.device).masked_fill_(
                    ~m, torch.finfo(self.dtype).min
                )
            out[kind] = m
        return out if self._single_mask_kind is None else out[self._single_mask_kind]

    @torch.no_grad()
    def forward(
        self,
        rows: list[int],
        input_ids: torch.Tensor,  # [R, Q]
        start: torch.Tensor,  # [R] int64, position of input_ids[:, 0]
        logit_idx: torch.Tensor | None = None,  # [R, M] query indices needing logits; None = all
    ) -> TargetOutput:
        r, q = input_ids.shape
        start = start.to(self.device)
        kv_len = self.cache.bind(rows, start, q)
        pos = start.view(-1, 1) + torch.arange(q, device=self.device)  # [R, Q]
        kwargs = {
            "attention_mask": self._masks(start, q, kv_len),
            "position_ids": pos,
            self._cache_kw: self.cache,
        }
        ids = input_ids.to(self.device)
        if self.capture is not None:
            cap = self.capture(ids, use_cache=True, **kwargs)
            final, aux = cap.final, cap.aux
        else:
            out = self.decoder(input_ids=ids, use_cache=True, **kwargs)
            final, aux = out.last_hidden_state, None
        if logit_idx is not None:
            idx = logit_idx.to(self.device)
            final = final.gather(1, idx.unsqueeze(-1).expand(-1, -1, final.shape[-1]))
        logits = self.lm_head(final)
        if logits.dtype != torch.float64:
            logits = logits.float()
        return TargetOutput(softcap_logits(logits, self.logit_softcap), aux)
