"""AdamW's parameter groups: the Markov head may learn at its own rate.

`optim.markov_lr_scale` multiplies the learning rate of the Markov head's parameters (`markov_w1`,
the embedding of the previous token, and `markov_w2`, its projection to the draft vocabulary, plus
the gated/rnn heads' own layers). The head starts at zero output (train/loop/objective.py), so an
untrained DSpark draft is its DFlash backbone, and at the backbone's rate its bias grows slowly:
on the tiny target, 300 steps, the held-out analytic tau rose 2.332 -> 2.964 with the head at 10x;
on SmolLM2 (600 steps) 10x gave DSpark / DFlash 1.068 analytic, and what 1x gives there in the
same run is not measured yet.
speculators' DSpark recipe also gives the head ten times the backbone's rate.
`optim.markov_weight_decay` (unset: `optim.weight_decay`) is the head's own AdamW weight decay: a
head read over few rows many times learns their transitions, which cost its held-out slot 0 most
(SmolLM2, the head at 10x on the target's greedy answers). With the scale at 1 and
no decay of its own there is one group, as before, so older checkpoints resume (a saved
optimizer's group count must match).
"""

from __future__ import annotations

from torch import nn


def check_markov_options(markov_lr_scale: float, markov_weight_decay: float | None) -> None:
    """ValueError unless the head's scale is > 0 and its own decay, if set, >= 0."""
    if not markov_lr_scale > 0:
        raise ValueError(f"optim.markov_lr_scale={markov_lr_scale}: must be > 0")
    if markov_weight_decay is not None and not markov_weight_decay >= 0:
        raise ValueError(
            f"optim.markov_weight_decay={markov_weight_decay}: must be >= 0 "
            "(unset: optim.weight_decay)"
        )


def param_groups(
    module: nn.Module,
    markov_head: nn.Module | None,
    lr: float,
    markov_lr_scale: float,
    markov_weight_decay: float | None = None,
) -> list[dict]:
    """Trainable parameters of `module` as AdamW groups: one at `lr` (AdamW's own weight decay),
    or, where the Markov head (a submodule of `module`, told apart by identity, so wrappers such
    as torch.compile's do not matter) has a scale other than 1 or a weight decay of its own, the
    rest at `lr` and the head at `lr * markov_lr_scale` with `markov_weight_decay` if given."""
    check_markov_options(markov_lr_scale, markov_weight_decay)
    trainable = [p for p in module.parameters() if p.requires_grad]
    head = {id(p) for p in markov_head.parameters()} if markov_head is not None else set()
    markov = [p for p in trainable if id(p) in head]
    if (markov_lr_scale == 1.0 and markov_weight_decay is None) or not markov:
        return [{"params": trainable, "lr": lr}]
    rest = [p for p in trainable if id(p) not in head]
    group = {"params": markov, "lr": lr * markov_lr_scale}
    if markov_weight_decay is not None:
        group["weight_decay"] = markov_weight_decay
    return [{"params": rest, "lr": lr}, group]
