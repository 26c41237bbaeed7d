"""`init_markov_from_embedding=true`: the Markov head's previous-token rows start from the target's
token embedding instead of noise.

The head's bias for slot k is a function of the previous token alone (`W2 W1[x_{k-1}]`,
common/model/heads.py), and `W1` has a row for every target id, each trained only where its token
comes before a slot. Started as noise, the rows of tokens the training answers hold rarely stay
noise, and the rows learn each token apart; held out, the head's gain fell from 1.229 on the
training rows to 1.048 on SmolLM2 (1,000 steps on the target's greedy answers). Started from the
embedding's top `r` principal directions, tokens the target embeds alike begin alike. Only the start
changes: `W1` stays a free table, exported and served as before (vLLM reads it as an embedding
table). Where the rank exceeds the hidden size, the columns past it keep their noise.
"""

from __future__ import annotations

import torch

from common.model import DSparkDraftModel


@torch.no_grad()
def markov_rows_from_embedding(draft: DSparkDraftModel, embed: torch.Tensor, std: float = 0.02):
    """Set `draft`'s `markov_w1` [V, r] to the target embedding `embed` [V, H], centred and
    projected on its top min(r, H) principal directions, scaled to `std` (the noise it replaces);
    returns the share of the embedding's variance those directions hold."""
    w1 = draft.markov_head.markov_w1.weight
    if embed.shape[0] != w1.shape[0]:
        raise ValueError(f"embedding has {embed.shape[0]} rows, markov_w1 {w1.shape[0]}")
    e = embed.double()
    e = e - e.mean(0, keepdim=True)
    vals, vecs = torch.linalg.eigh(e.T @ e)  # ascending
    k = min(w1.shape[1], e.shape[1])
    proj = e @ vecs[:, -k:].flip(-1)
    w1[:, :k] = (proj * (std / proj.std())).to(w1.dtype)
    return float(vals[-k:].sum() / vals.sum())
