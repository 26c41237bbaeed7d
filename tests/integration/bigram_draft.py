"""A draft that knows the word-level trained target's answers (`tests.tiny.write_trained_target`):
its Markov head maps each answer word to the next one of the target's permutation walk, so it is
accepted almost always, with no training. Drafts whose serving reads differ from the reference's
(a d2t map permuted) then collapse visibly, which a random draft could not show."""

from __future__ import annotations

from pathlib import Path

import torch

from common.checkpoint import save_checkpoint
from tests.tiny import ROLES, SPECIALS, TRAINED_WORDS, write_draft


def trained_target_perm(seed: int = 0) -> torch.Tensor:
    """The permutation `write_trained_target(seed=seed)` answers with (word id -> next word id),
    drawn as it draws it: the generator's first use."""
    g = torch.Generator().manual_seed(seed)
    return len(SPECIALS + ROLES) + torch.randperm(TRAINED_WORDS, generator=g)


@torch.no_grad()
def write_bigram_draft(target: Path, out: Path, seed: int = 0, scale: float = 30.0) -> Path:
    """A reduced-vocab (200 ids: target ids 0..199, d2t all zero) draft whose Markov bias puts
    `scale` on perm[previous word] for every answer word."""
    _, model = write_draft(target, out, draft_vocab_size=200, markov_rank=TRAINED_WORDS, seed=seed)
    model.d2t.zero_()
    model.t2d.zero_()
    model.t2d[:200] = True
    first = len(SPECIALS + ROLES)
    perm = trained_target_perm(seed)
    w1, w2 = model.markov_head.markov_w1.weight, model.markov_head.markov_w2.weight
    w1.zero_()
    w2.zero_()
    for j in range(TRAINED_WORDS):
        w1[first + j, j] = 1.0
        w2[int(perm[j]), j] = scale  # draft id == target id below 200
    return save_checkpoint(
        model,
        out,
        dtype=torch.float32,
        include_embed=True,
        include_lm_head=True,
        verifier=str(target),
    )
