"""`init_from=DIR`: start a run from an exported draft's weights instead of fresh ones.

A draft shipped by one run (OUTPUT/final, either layout) goes on learning in another: with more
data, another schedule, or in the next GPU session when a session's time ends before the draft
has converged. Unlike `resume=true` (same run, same data, optimizer and data order restored
exactly), this takes only the weights: the optimizer, schedule and data order start afresh, and
the data may differ.

The draft must be the one this run's config builds: every field of the checkpoint's config that
shapes the weights or what they mean (layers, sizes, block, Markov head, target layers, mask
token, the target's config hash) must equal this run's, or the run stops naming each difference.
With a reduced vocabulary, `init_from_vocab=keep` (the default) takes the checkpoint's own
draft -> target map with its lm_head rows, and the map this run counted from its data is not used.
`init_from_vocab=rebuild` keeps this run's map (and its size): the lm_head rows are the target's
for it as in a fresh run, the Markov output rows (`markov_w2`, one per draft id) of target ids in
both maps come from the checkpoint, and ids new to the map start at zero as in a fresh draft; every
other weight is the checkpoint's. A draft trained on with new data (code, later turns) can then
propose the tokens that data made frequent: a token outside the map ends every round that meets
it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.checkpoint import CONFIG_NAME, WEIGHTS_NAME, load_checkpoint, read_config
from common.model import DSparkDraftModel
from train.errors import SetupError
from train.loop.schedule import warmup_steps
from train.loop.state import setting_differences
from train.publish.package_files import sha256_file

# Config keys that may differ: where the target lives, free-form extras, and serving settings
# that the weights do not depend on.
FREE_KEYS = ("target_name_or_path", "dspark_extra", "num_speculative_tokens", "dspark_draft_topk")
VOCAB_MODES = ("keep", "rebuild")
# The tensors a rebuilt vocabulary does not take whole from the checkpoint.
MAP_TENSORS = ("d2t", "t2d", "lm_head.weight")
MARKOV_ROWS = "markov_head.markov_w2.weight"
# A shorter warm-up draws a note: the optimizer starts empty, and Adam's first update moves every
# weight by about the learning rate whatever its gradient's size. On SmolLM2 three steps with a
# one-step warm-up took the pinned draft's held-out tau from 2.111 to 1.495, with a 160-step one
# to 2.113.
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
        "keeps it"
    )


def warm_start(
    draft: DSparkDraftModel,
    ckpt_dir: str,
    embed: torch.Tensor,
    head: torch.Tensor,
    vocab: str = "keep",
) -> dict:
    """Load `ckpt_dir`'s weights into `draft` (in place, its dtype and device kept); `embed` and
    `head` are the target's tables, for what the export shares with the target; `vocab` is
    `init_from_vocab` (module docstring: "rebuild" needs `draft` to hold this run's map already).
    Returns what the provenance records: the folder, its weights' sha256 and the vocabulary."""
    if vocab not in VOCAB_MODES:
        raise SetupError(f"init_from_vocab={vocab!r}: one of {', '.join(VOCAB_MODES)}")
    path = Path(ckpt_dir)
    missing = [n for n in (CONFIG_NAME, WEIGHTS_NAME) if not (path / n).is_file()]
    if missing:
        raise SetupError(
            f"init_from={ckpt_dir}: no {' or '.join(missing)} there; give an exported draft "
            "folder (OUTPUT/final of a run)"
        )
    rebuild = vocab == "rebuild" and draft.config.reduced_vocab
    free = (*FREE_KEYS, "draft_vocab_size") if rebuild else FREE_KEYS
    diffs = setting_differences(
        read_config(path).to_hf_dict(), draft.config.to_hf_dict(), "this run", ignore=free
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
    record = {"path": str(path), "weights_sha256": sha256_file(path / WEIGHTS_NAME)}
    with torch.no_grad():
        for name, t in loaded.items():
            if rebuild and (name in MAP_TENSORS or name == MARKOV_ROWS):
                continue
            state[name].copy_(t.to(state[name].dtype))
        if not rebuild:
            return {**record, "vocab": "keep"}
        rows = rows_in(src.draft_ids_in_target, draft.draft_ids_in_target.cpu())
        kept = rows >= 0
        if MARKOV_ROWS in state:
            w2 = state[MARKOV_ROWS]
            w2[kept.to(w2.device)] = loaded[MARKOV_ROWS][rows[kept]].to(w2)
    return {
        **record,
        "vocab": "rebuild",
        "vocab_ids_kept": int(kept.sum()),
        "vocab_ids_new": int((~kept).sum()),
    }


def rows_in(old_ids: torch.Tensor, new_ids: torch.Tensor) -> torch.Tensor:
    """[len(new_ids)] int64: the row of each target id of `new_ids` in `old_ids` (both a map's
    draft ids in target ids, [Vd]), -1 where the old map lacks it."""
    size = int(max(old_ids.max(), new_ids.max())) + 1
    where = torch.full((size,), -1, dtype=torch.long)
    where[old_ids.long()] = torch.arange(old_ids.numel())
    return where[new_ids.long()]
