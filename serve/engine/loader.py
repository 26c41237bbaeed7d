"""Load and cross-check the target, its tokenizer and the DSpark draft.

Every check here guards a mistake that would otherwise run silently with garbage acceptance or
crash deep inside a forward: the messages say what to change. The draft/target comparison
(`check_pair`, common.target_fit's) runs once, here, before the draft's weights load; not at all
when the options say the caller checked the checkpoint already (`serve.launch` does, once per
launch).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from common.checkpoint import load_checkpoint, read_config
from common.config import ConfigError, DSparkConfig
from common.target_fit import fit_problems
from serve.engine.options import EngineOptions, OptionsError

SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}


def _text_config(model_or_config):
    cfg = getattr(model_or_config, "config", model_or_config)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def check_target(model: nn.Module) -> None:
    """The target must be a decoder-only attention LM the slot KV cache can drive."""
    cfg = _text_config(model)
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if not kinds <= SUPPORTED_LAYER_TYPES:
        raise OptionsError(
            f"target layer types {sorted(kinds - SUPPORTED_LAYER_TYPES)} are not supported by the "
            "embedded engine (full/sliding attention only): serve this target with vLLM."
        )
    if model.get_output_embeddings() is None:
        raise OptionsError("the target has no output embedding (lm_head): load a *ForCausalLM.")


def check_pair(model: nn.Module, draft_cfg: DSparkConfig, tokenizer=None) -> None:
    """Raise OptionsError if the draft was not built for this target (and tokenizer)."""
    problems = fit_problems(draft_cfg, _text_config(model).to_dict(), tokenizer)
    if problems:
        raise OptionsError("draft/target mismatch:\n  " + "\n  ".join(problems))


def resolve_num_speculative_tokens(opts: EngineOptions, draft_cfg: DSparkConfig) -> int:
    """N: the option if given, else the checkpoint layout's (`DSparkConfig.drafts_per_step`)."""
    try:
        return draft_cfg.drafts_per_step(opts.num_speculative_tokens)
    except ConfigError as e:
        raise OptionsError(str(e)) from None


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise OptionsError(f"cannot load a tokenizer from target folder {path}: {e}") from e


def load_models(opts: EngineOptions):
    """-> (target model, draft model or None, tokenizer or None). Validated."""
    from transformers import AutoModelForCausalLM

    if not Path(opts.target).is_dir():
        raise OptionsError(f"target={opts.target!r} is not a folder: give a local HF model folder.")
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        raise OptionsError(f"device={opts.device!r} but CUDA is unavailable: use device='cpu'.")
    draft_cfg = None
    if opts.checkpoint is not None:
        if not (Path(opts.checkpoint) / "config.json").is_file():
            raise OptionsError(f"checkpoint={opts.checkpoint!r} has no config.json.")
        draft_cfg = read_config(opts.checkpoint)
    has_tok = any(
        os.path.exists(os.path.join(opts.target, f))
        for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    )
    tokenizer = load_tokenizer(opts.target) if has_tok else None
    target = AutoModelForCausalLM.from_pretrained(
        opts.target, dtype=opts.torch_dtype, attn_implementation="sdpa"
    )
    target.to(opts.device).eval().requires_grad_(False)
    check_target(target)
    draft = None
    if draft_cfg is not None:
        if not opts.checkpoint_checked:  # serve.launch validated it once already
            check_pair(target, draft_cfg, tokenizer)
        draft = load_checkpoint(
            opts.checkpoint,
            dtype=opts.torch_dtype,
            device=opts.device,
            target_embed=target.get_input_embeddings().weight.detach().cpu(),
            target_lm_head=target.get_output_embeddings().weight.detach().cpu(),
        )
        draft.eval().requires_grad_(False)
    return target, draft, tokenizer


def eos_ids(model: nn.Module, tokenizer=None) -> list[int]:
    """Stop ids: the generation config's eos id(s) plus the tokenizer's."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if src is None:
            continue
        ids.extend(src if isinstance(src, (list, tuple)) else [src])
    return sorted({int(i) for i in ids})
