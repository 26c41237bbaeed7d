"""Capture from a frozen HF causal LM exactly what vLLM feeds a DSpark draft.

vLLM's aux hidden state for layer i is the residual stream *after* decoder layer i, before the
final norm (HF's `output_hidden_states[i+1]` for i < N-1). We read it with forward hooks on the
decoder layers instead of `output_hidden_states=True`, which would keep every layer alive. The
same forward also returns the final (post-norm) hidden state, from which the teacher logits are
computed in vocab chunks by the caller (never a [tokens, vocab] fp32 tensor here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Capture:
    """aux: [N, T, L*H_t] layers concatenated in ascending id order; final: [N, T, H_t] post-norm;
    past_key_values: the model's cache when `use_cache=True`."""

    aux: torch.Tensor
    final: torch.Tensor
    past_key_values: object | None = None

    def finite(self) -> torch.Tensor:
        """On the device, no host sync: every captured and final hidden state is finite."""
        return torch.isfinite(self.aux).all() & torch.isfinite(self.final).all()


def require_finite_target(finite) -> None:
    """Raise for a `Capture.finite()` flag (read on the host) that is False."""
    if not bool(finite):
        raise FloatingPointError(
            "NaN/Inf in the target's hidden states: check the target dtype (bf16 overflow?) "
            "and the input ids"
        )


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of an HF causal LM (model.model.layers for Llama/Qwen families)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(
            f"cannot find decoder layers on {type(model).__name__}: expected "
            "model.get_decoder().layers (Llama/Qwen-style HF causal LM)"
        )
    return layers


class TargetCapture:
    """Hooks `layer_ids` of `model`; call it like the model, get a `Capture`."""

    def __init__(self, model: nn.Module, layer_ids: list[int], check_finite: bool = False):
        """check_finite: raise on NaN/Inf states at once (a host sync per call); a caller that
        batches its syncs leaves it off and checks `Capture.finite()` itself."""
        self.model, self.layer_ids, self.check_finite = model, list(layer_ids), check_finite
        layers = decoder_layers(model)
        bad = [i for i in self.layer_ids if not 0 <= i < len(layers) - 1]
        if bad:
            raise ValueError(
                f"target_layer_ids {bad} do not exist in this target ({len(layers)} layers; "
                f"valid ids 0..{len(layers) - 2}, the final layer is excluded): fix "
                "draft.target_layer_ids"
            )
        self._store: dict[int, torch.Tensor] = {}
        self._handles = [layers[i].register_forward_hook(self._hook(i)) for i in self.layer_ids]

    def close(self) -> None:
        """Remove the hooks (a benchmark builds several captures on one target)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, i: int):
        def save(_module, _inputs, output):
            self._store[i] = output[0] if isinstance(output, tuple) else output

        return save

    @torch.no_grad()
    def __call__(self, input_ids, use_cache: bool = False, **kwargs) -> Capture:
        self._store.clear()
        out = self.model.get_decoder()(input_ids=input_ids, use_cache=use_cache, **kwargs)
        aux = torch.cat([self._store[i] for i in self.layer_ids], dim=-1)
        self._store.clear()
        # transformers >= 5.2x names the cache `cache`; older 5.x `past_key_values`.
        cache = out.get("cache", None) if "cache" in out else out.get("past_key_values", None)
        cap = Capture(aux, out.last_hidden_state, cache)
        if self.check_finite:  # one host sync for both checks
            require_finite_target(cap.finite())
        return cap


def target_head_weights(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding [V, H], lm_head [V, H]) of an HF causal LM.

    The embedding is the stored weight: Gemma's forward multiplies it by sqrt(hidden), vLLM's
    draft reads the shared table without that factor, and so does ours (train and serve alike)."""
    return model.get_input_embeddings().weight, model.get_output_embeddings().weight


def target_logit_softcap(model_or_config) -> float | None:
    """The target's final-logit soft cap (Gemma 2/3 `final_logit_softcapping`), or None.

    HF's forward and vLLM's logits processor both turn the lm_head output z into
    `cap * tanh(z / cap)`; the teacher and the engine's verification must do the same."""
    cfg = getattr(model_or_config, "config", model_or_config)
    if isinstance(cfg, dict):
        cfg = cfg.get("text_config") or cfg
        cap = cfg.get("final_logit_softcapping")
    else:
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        cap = getattr(cfg, "final_logit_softcapping", None)
    return float(cap) if cap else None


def softcap_logits(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """`cap * tanh(logits / cap)`; identity when cap is None."""
    return logits if cap is None else torch.tanh(logits / cap) * cap
