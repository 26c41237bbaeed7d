"""`init_from=DIR`: start a run from an exported draft's weights instead of fresh ones.

A draft shipped by one run (OUTPUT/final, either layout) goes on learning in another: with more
data, another schedule, or in the next GPU session when a session's time ends before the draft
has converged. Unlike `resume=true` (same run, same data, optimizer and data order restored
exactly), this takes only the weights: the optimizer, schedule and data order start afresh, and
the data may differ.

The draft must be the one this run's config builds: every field of the checkpoint's config that
shapes the weights or what they mean (layers, sizes, block, Markov head, target layers, mask
token, the target's config hash) must equal this run's, or the run stops naming each difference.
With a reduced vocabulary the checkpoint's own draft -> target map comes with its lm_head rows;
the map this run counted from its data is not used.
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.checkpoint import CONFIG_NAME, WEIGHTS_NAME, load_checkpoint, read_config
from common.model import DSparkDraftModel
from train.package_files import sha256_file
from train.schedule import warmup_steps
from train.setup import SetupError
from train.state import setting_differences

# Config keys that may differ: where the target lives, free-form extras, and serving settings
# that the weights do not depend on.
FREE_KEYS = ("target_name_or_path", "dspark_extra", "num_speculative_tokens", "dspark_draft_topk")
# A shorter warm-up draws a note: the optimizer starts empty, and Adam's first update moves every
# weight by about the learning rate whatever its gradient's size. On SmolLM2 three steps with a
# one-step warm-up took the pinned draft's held-out tau from 2.111 to 1.495, with a 160-step one
# to 2.113 (scripts/init_from_warmup.sh; docs/benchmarks.md, "init_from and the warm-up").
MIN_WARMUP_STEPS = 20


def warmup_note(optim_cfg, max_steps: int) -> str | None:
    """A warning for an init_from run whose warm-up (over `max_steps`) is under MIN_WARMUP_STEPS."""
    warmup = warmup_steps(optim_cfg.warmup_ratio, max_steps)
    if warmup >= MIN_WARMUP_STEPS:
        return None
    return (
        f"[distill] note: init_from with a {warmup}-step warm-up (optim.warmup_ratio="
        f"{optim_cfg.warmup_ratio} of {max_steps} steps): the optimizer starts empty and its first "
        f"steps at the full rate can undo a trained draft; a warm-up of {MIN_WARMUP_STEPS}+ steps "
        'keeps it (docs/benchmarks.md, "init_from and the warm-up")'
    )


def warm_start(
    draft: DSparkDraftModel, ckpt_dir: str, embed: torch.Tensor, head: torch.Tensor
) -> dict:
    """Load `ckpt_dir`'s weights into `draft` (in place, its dtype and device kept); `embed` and
    `head` are the target's tables, for what the export shares with the target. Returns what the
    provenance records: the folder and its weights' sha256."""
    path = Path(ckpt_dir)
    missing = [n for n in (CONFIG_NAME, WEIGHTS_NAME) if not (path / n).is_file()]
    if missing:
        raise SetupError(
            f"init_from={ckpt_dir}: no {' or '.join(missing)} there; give an exported draft "
            "folder (OUTPUT/final of a run)"
        )
    diffs = setting_differences(
        read_config(path).to_hf_dict(), draft.config.to_hf_dict(), "this run", ignore=FREE_KEYS
    )
    if diffs:
        raise SetupError(
            f"init_from={ckpt_dir} is not the draft this config builds: " + "; ".join(diffs)
        )
    src = load_checkpoint(path, target_embed=embed.float().cpu(), target_lm_head=head.float().cpu())
    state, loaded = draft.state_dict(), src.state_dict()
    if set(state) != set(loaded):
        raise SetupError(
            f"init_from={ckpt_dir}: its tensors {sorted(set(loaded) ^ set(state))} do not match "
            "this draft's"
        )
    with torch.no_grad():
        for name, t in loaded.items():
            state[name].copy_(t.to(state[name].dtype))
    return {"path": str(path), "weights_sha256": sha256_file(path / WEIGHTS_NAME)}
