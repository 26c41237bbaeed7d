"""End of training: write OUTPUT/final (canonical vLLM layout, validated before the rename),
optionally OUTPUT/final-speculators, the model card, and push to the Hub."""

from __future__ import annotations

from pathlib import Path

import torch

from common.checkpoint import WEIGHTS_NAME, save_checkpoint
from common.model import DSparkDraftModel
from common.target_fit import TOKENIZER_HASH_KEY, load_target_tokenizer, tokenizer_hash
from train.loop.state import clear_leftovers

EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def print_export_size(ckpt: Path) -> None:
    """One line: the folder's weights size, and the target tables it leaves to the loader."""
    from safetensors import safe_open

    with safe_open(str(ckpt / WEIGHTS_NAME), framework="pt") as f:
        keys = set(f.keys())
    size = sum(p.stat().st_size for p in ckpt.iterdir() if p.is_file())
    shared = [k for k in ("embed_tokens.weight", "lm_head.weight") if k not in keys]
    note = f" (shares the target's {', '.join(shared)})" if shared else ""
    print(f"[distill] exported {ckpt}: {size / 2**20:.2f} MiB{note}")


def export_final(cfg, draft: DSparkDraftModel, output_dir: Path, provenance: dict, result) -> Path:
    """Each folder (with its model card) appears complete or not at all: a write that fails at any
    point leaves the earlier export of that folder as it was. What an export killed midway left
    beside the folder (its hidden temp folder, a full export's worth of bytes) goes first."""
    ecfg = cfg.export
    dtype = EXPORT_DTYPES[ecfg.dtype]
    provenance = {**provenance, **_tokenizer_record(cfg.target.path)}
    metrics = dict(result.eval or result.train)
    per_pos = metrics.pop("acceptance_per_pos", [])
    if per_pos:  # what the serving watchdog (serve/watchdog.py) compares the live acceptance with
        provenance["expected_acceptance"] = {
            "per_position": [float(a) for a in per_pos],
            "source": "held-out evaluation" if result.eval else "last training step",
            "measure": "conditional acceptance (1 - TV) of draft k given drafts 0..k-1 accepted",
        }
    if result.eval_initial:
        metrics["untrained_analytic_tau"] = result.eval_initial["analytic_tau"]
    recipe = {
        "steps": result.step,
        "lr": cfg.optim.lr,
        "markov_lr_scale": cfg.optim.markov_lr_scale,
        "markov_weight_decay": cfg.optim.markov_weight_decay,
        "init_markov_from_embedding": cfg.init_markov_from_embedding,
        "micro_batch_size": cfg.trainer.micro_batch_size,
        "grad_accum": cfg.trainer.grad_accum,
        "seq_len": cfg.data.seq_len,
        "num_anchors": cfg.trainer.num_anchors,
        "data": cfg.data.train,
        "seed": cfg.seed,
    }
    try:
        from train.publish.model_card import write_model_card
    except ImportError:  # model card module not available: the checkpoint stands on its own
        write_model_card = None

    def card_for(dest: Path):
        if write_model_card is None:
            return None
        return lambda tmp: write_model_card(
            tmp,
            target=cfg.target.path,
            recipe=recipe,
            metrics={k: v for k, v in metrics.items() if not isinstance(v, list)},
            per_position_acceptance=per_pos,
            repo_id=cfg.hub.repo_id,
            local_path=dest,
        )

    folders = [("canonical", output_dir / "final")]
    if ecfg.speculators:
        folders.append(("speculators", output_dir / "final-speculators"))
    for fmt, dest in folders:
        clear_leftovers(dest.parent, (f".{dest.name}.tmp-*", f".{dest.name}.old-*"))
        save_checkpoint(
            draft,
            dest,
            fmt=fmt,
            dtype=dtype,
            include_embed=ecfg.include_embed,
            include_lm_head=ecfg.include_lm_head,
            provenance=provenance,
            verifier=cfg.target.path,
            before_publish=card_for(dest),
        )
        print_export_size(dest)
    final = output_dir / "final"
    if cfg.hub.repo_id:
        from train.publish.push import push_checkpoint

        url = push_checkpoint(final, cfg.hub.repo_id, private=cfg.hub.private)
        print(f"[distill] pushed {final} to {url}")
    return final


def _tokenizer_record(target_path: str) -> dict:
    """The target tokenizer's hash, so serving can tell another tokenizer (common.target_fit)."""
    try:
        tok = load_target_tokenizer(target_path)
    except (OSError, ValueError):
        tok = None
    return {TOKENIZER_HASH_KEY: tokenizer_hash(tok)} if tok is not None else {}
