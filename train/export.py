"""End of training: write OUTPUT/final (canonical vLLM layout, validated before the rename),
optionally OUTPUT/final-speculators, the model card, and push to the Hub."""

from __future__ import annotations

from pathlib import Path

import torch

from common.checkpoint import WEIGHTS_NAME, save_checkpoint
from common.model import DSparkDraftModel

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
    ecfg = cfg.export
    dtype = EXPORT_DTYPES[ecfg.dtype]
    kw = dict(
        dtype=dtype,
        include_embed=ecfg.include_embed,
        include_lm_head=ecfg.include_lm_head,
        provenance=provenance,
        verifier=cfg.target.path,
    )
    final = save_checkpoint(draft, output_dir / "final", **kw)
    print_export_size(final)
    if ecfg.speculators:
        print_export_size(
            save_checkpoint(draft, output_dir / "final-speculators", fmt="speculators", **kw)
        )
    metrics = dict(result.eval or result.train)
    per_pos = metrics.pop("acceptance_per_pos", [])
    if result.eval_initial:
        metrics["untrained_analytic_tau"] = result.eval_initial["analytic_tau"]
    recipe = {
        "steps": result.step,
        "lr": cfg.optim.lr,
        "micro_batch_size": cfg.trainer.micro_batch_size,
        "grad_accum": cfg.trainer.grad_accum,
        "seq_len": cfg.data.seq_len,
        "num_anchors": cfg.trainer.num_anchors,
        "data": cfg.data.train,
        "seed": cfg.seed,
    }
    try:
        from train.model_card import write_model_card
    except ImportError:  # model card module not available: the checkpoint stands on its own
        write_model_card = None
    if write_model_card is not None:
        for d in [final] + ([output_dir / "final-speculators"] if ecfg.speculators else []):
            write_model_card(
                d,
                target=cfg.target.path,
                recipe=recipe,
                metrics={k: v for k, v in metrics.items() if not isinstance(v, list)},
                per_position_acceptance=per_pos,
                repo_id=cfg.hub.repo_id,
            )
            for f in d.iterdir():  # the card too: world-readable whatever the umask
                f.chmod(0o644)
    if cfg.hub.repo_id:
        from train.push import push_checkpoint

        url = push_checkpoint(final, cfg.hub.repo_id, private=cfg.hub.private)
        print(f"[distill] pushed {final} to {url}")
    return final
