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
from train.setup import SetupError
from train.state import setting_differences

# Config keys that may differ: where the target lives, free-form extras, and serving settings
# that the weights do not depend on.
FREE_KEYS = ("target_name_or_path", "dspark_extra", "num_speculative_tokens", "dspark_draft_topk")


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
