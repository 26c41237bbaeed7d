"""AdamW's parameter groups: the Markov head may learn at its own rate.

`optim.markov_lr_scale` multiplies the learning rate of the Markov head's parameters (`markov_w1`,
the embedding of the previous token, and `markov_w2`, its projection to the draft vocabulary, plus
the gated/rnn heads' own layers). The head starts at zero output (train/objective.py), so an
untrained DSpark draft is its DFlash backbone, and at the backbone's rate its bias grows slowly:
on the tiny target, 300 steps, the held-out analytic tau rose 2.332 -> 2.964 with the head at 10x;
on SmolLM2 (600 steps) 10x gave DSpark / DFlash 1.068 analytic, and what 1x gives there in the
same run is not measured yet (docs/benchmarks.md, "The Markov head's learning rate").
speculators' DSpark recipe also gives the head ten times the backbone's rate. With the scale at 1
there is one group, as before, so older checkpoints resume (a saved optimizer's group count must
match).
"""

from __future__ import annotations

from torch import nn

MARKOV_PREFIX = "markov_head."


def is_markov_param(name: str) -> bool:
    """True for a parameter of the draft's Markov head, however deep the module path is."""
    return name.startswith(MARKOV_PREFIX) or f".{MARKOV_PREFIX}" in name


def param_groups(module: nn.Module, lr: float, markov_lr_scale: float) -> list[dict]:
    """Trainable parameters of `module` as AdamW groups: one at `lr`, or, with a scale other than
    1 and a Markov head present, the rest at `lr` and the head at `lr * markov_lr_scale`."""
    if not markov_lr_scale > 0:
        raise ValueError(f"optim.markov_lr_scale={markov_lr_scale}: must be > 0")
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    markov = [p for n, p in named if is_markov_param(n)]
    if markov_lr_scale == 1.0 or not markov:
        return [{"params": [p for _, p in named], "lr": lr}]
    rest = [p for n, p in named if not is_markov_param(n)]
    return [{"params": rest, "lr": lr}, {"params": markov, "lr": lr * markov_lr_scale}]
