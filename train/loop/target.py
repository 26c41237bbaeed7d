"""The frozen target of a run: built or prepared when missing, loaded, and set up for speed."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.target import decoder_layers
from train.errors import SetupError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def ensure_target(tcfg) -> None:
    """Build the target at `path` if it is missing and the config says how: `prepare` names a
    real model (train/prepare/target.py), `build_tiny` the embedded tiny target."""
    if Path(tcfg.path).exists():
        return
    name = tcfg.get("prepare")
    if name:
        from train.prepare.target import PrepareError, prepare

        print(
            f"[distill] target {tcfg.path} is missing: preparing it "
            f"(python -m train.prepare.target {name} --out {tcfg.path})"
        )
        try:
            prepare(name, tcfg.path)
        except PrepareError as e:
            raise SetupError(f"target.prepare={name!r}: {e}") from e
        return
    if not tcfg.build_tiny:
        return
    from train.tiny_target.build import build_tiny_target

    print(
        f"[distill] building the tiny target at {tcfg.path}: it trains until its held-out loss is "
        f"under its target (at most {tcfg.tiny_minutes:g} min)"
    )
    build_tiny_target(tcfg.path, minutes=tcfg.tiny_minutes)


def load_target(tcfg, device: torch.device):
    """-> (frozen model in eval mode, tokenizer)."""
    ensure_target(tcfg)
    try:
        tok = AutoTokenizer.from_pretrained(tcfg.path, trust_remote_code=tcfg.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            tcfg.path,
            dtype=resolve_dtype(tcfg.dtype, device),
            trust_remote_code=tcfg.trust_remote_code,
        )
    except OSError as e:
        raise SetupError(
            f"cannot load target {tcfg.path!r}: {e}. Give target.path a local HF model folder "
            "(no hub access here) or set target.build_tiny=true for the embedded tiny target."
        ) from e
    model.requires_grad_(False).eval().to(device)
    vocab = model.config.get_text_config().vocab_size
    if len(tok) > vocab:
        raise SetupError(
            f"tokenizer has {len(tok)} tokens but the target's vocab_size is {vocab}: "
            "the tokenizer does not belong to this target"
        )
    return model, tok


def apply_speed_settings(tcfg, draft, target, device: torch.device) -> None:
    """`trainer.draft_attention`, `trainer.target_attention`, `trainer.compile_draft` and
    `trainer.compile_target` onto the models before training; `trainer.compile_loss` is applied
    by `DistillObjective` and only checked here. GPU only: there is no flex-attention backward
    on the CPU, and compiling was measured only on the GPU
    (scripts/bench_train_scale.py at the Qwen3-8B shape). A target
    left on flex by an earlier call goes back to sdpa."""
    attention = {k: tcfg.get(k, "sdpa") for k in ("draft_attention", "target_attention")}
    compiled = {
        k: bool(tcfg.get(k, False)) for k in ("compile_draft", "compile_target", "compile_loss")
    }
    gpu_only = [f"trainer.{k}=flex" for k, v in attention.items() if v == "flex"]
    gpu_only += [f"trainer.{k}=true" for k, v in compiled.items() if v]
    if device.type != "cuda" and gpu_only:
        raise SetupError(
            f"{', '.join(gpu_only)}: GPU only, and this run trains on {device.type}; leave "
            "them at their defaults (sdpa, false) there"
        )
    draft.train_attention = attention["draft_attention"]
    if attention["target_attention"] == "flex":
        target.set_attn_implementation("flex_attention")
    elif getattr(target.config, "_attn_implementation", None) == "flex_attention":
        target.set_attn_implementation("sdpa")
    if compiled["compile_draft"]:
        for layer in draft.layers:
            layer.compile()
    # The target's layers before TargetCapture hooks them (a compiled call runs the hooks).
    for layer in decoder_layers(target):
        if compiled["compile_target"]:
            layer.compile()
        else:  # undo an earlier call's (nn.Module.compile keeps the compiled call here)
            layer._compiled_call_impl = None
