"""The sequential stage of DSpark drafting: a left-to-right Markov walk over parallel base logits.

Semantics follow vLLM 0.34's DSparkSpeculator (`_sample_markov_chain`, `_sample_sequential_topk`):
- slot k: logits = U[:, k] + bias(prev), prev = the anchor token at k = 0, then x_{k-1} (target id);
- greedy (T <= 0) or keyed Gumbel at the request temperature, keyed by (seed, P_k - 1) on the
  DRAFT stream, noise keyed by target column;
- draft ids are mapped to target ids through d2t before feeding the next Markov step;
- confidences c_k = compute_confidence(h_k, embed_k) over the stacked Markov embeddings.
Differences from vLLM: every Markov head type goes through `model.markov_step` (vLLM has only the
vanilla `markov_bias(markov_embed(prev))`), and the sampled-from distributions are returned
compactly (`DraftProbs`) instead of being written to a dense logits cache.

Top-k (`topk=k`): candidates = topk(U_k) once for all slots, sorted by id so ties break towards the
lowest id exactly like the dense argmax; only they get the Markov bias, every other id has
probability 0. With k = V_draft this reproduces the dense walk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from common.sampling.draft_probs import DraftProbs
from common.sampling.gumbel import Stream, gumbel_sample, sampled_probs

ProbsMode = Literal["compact", "target", "none"]


@dataclass
class MarkovWalkOutput:
    """Result of one Markov walk over R requests and N drafted slots.

    Attributes:
        draft_ids: [R, N] int64 drafted tokens, target vocab ids.
        draft_probs: distributions sampled from (None when probs="none").
        confidence: [R, N] float32 accept-probability estimates, or None without a head.
    """

    draft_ids: torch.Tensor
    draft_probs: DraftProbs | None
    confidence: torch.Tensor | None


def model_config(model):
    """The draft's DSparkConfig (`model.config`, or `model.cfg` on lighter stand-ins)."""
    cfg = getattr(model, "config", None)
    return cfg if cfg is not None else model.cfg


def has_confidence_head(model) -> bool:
    return bool(getattr(model_config(model), "enable_confidence_head", False))


def draft_target_cols(model, num_draft: int, device: torch.device) -> torch.Tensor:
    """Target id of every draft id; [V_draft] int64 (arange for a full vocab)."""
    return model.map_draft_to_target(torch.arange(num_draft, device=device)).long()


_MISSING = object()


def gathered_markov_step(model, prev, hidden, state, cand):
    """One Markov step evaluated at candidate draft ids only; -> (bias [R, k], embed [R, r], state).

    Paths, first that applies:
    1. `model.markov_step_gathered(prev, hidden, state, cand)` if the model defines it;
    2. `model.markov_head` with `step(e, h, state) -> (u, state)` and `markov_w2` (common.model's
       layout, every head type): bias = W2[cand] @ u, gathered rows of markov_w2 as vLLM's
       `apply_markov_bias_gathered` does, so the cost is O(R k r) instead of O(R V_draft r);
    3. otherwise the dense `markov_step` bias gathered at `cand` (exact, saves nothing).
    """
    fn = getattr(model, "markov_step_gathered", None)
    if fn is not None:
        return fn(prev, hidden, state, cand)
    head = getattr(model, "markov_head", _MISSING)
    if head is None:  # DFlash (markov_rank 0): no bias
        e = model.markov_embed(prev)
        return torch.zeros(cand.shape, device=cand.device), e, state
    if head is not _MISSING and hasattr(head, "step") and hasattr(head, "markov_w2"):
        e = model.markov_embed(prev)
        u, state = head.step(e, hidden, state)  # [R, r]
        w = head.markov_w2.weight[cand]  # [R, k, r]
        return torch.bmm(w, u.to(w.dtype).unsqueeze(-1)).squeeze(-1), e, state
    bias, embed, state = model.markov_step(prev, hidden, state)
    return bias.gather(1, cand), embed, state


@torch.no_grad()
def markov_walk(
    model,
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchor_ids: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    topk: int | None = None,
    probs: ProbsMode = "compact",
    with_confidence: bool | None = None,
    vocab_size: int | None = None,
    fp64: bool = False,
    all_greedy: bool = False,
    on_slot_logits: Callable[[int, torch.Tensor], None] | None = None,
) -> MarkovWalkOutput:
    """Draft N tokens per request by the Markov walk.

    Args:
        model: a DSpark draft model (markov_step, map_draft_to_target, compute_confidence).
        base_logits: [R, N, V_draft] parallel-stage logits U.
        hidden: [R, N, H] post-norm hidden of the drafted slots (Markov gate/RNN and confidence).
        anchor_ids: [R] int64 target id of the token before slot 0.
        temperature: [R] float; <= 0 is greedy.
        seeds: [R] int64 per-request seeds.
        positions: [R] int64 position P_0 of the token drafted at slot 0; slot k's draw is keyed by
            P_0 + k - 1.
        topk: restrict each slot to topk(U_k) candidates (None = dense).
        probs: "compact" (DraftProbs in sampling space), "target" (dense [R, N, V] target space) or
            "none" (greedy-only callers).
        with_confidence: default: whether the config enables the confidence head.
        vocab_size: target vocab size; default model.config.vocab_size.
        fp64: float64 Gumbel noise.
        all_greedy: the caller guarantees every temperature is <= 0: skip the noise (an
            [R, V_draft] hash per slot). A host-side flag, so no device sync is needed.
        on_slot_logits: called as f(k, logits) with slot k's pre-temperature sampled-from logits
            ([R, V_draft], or [R, k] candidates for top-k: the other ids are -inf), where vLLM
            feeds its online acceptance estimator.
    """
    R, N, Vd = base_logits.shape
    device = base_logits.device
    if with_confidence is None:
        with_confidence = has_confidence_head(model)
    if vocab_size is None:
        vocab_size = model_config(model).vocab_size
    target_cols = draft_target_cols(model, Vd, device)  # [Vd]
    if topk is not None:
        topk = min(int(topk), Vd)
        values, cand = base_logits.topk(topk, dim=-1)  # [R, N, k], no fp32 copy of U
        cand, order = cand.sort(dim=-1)
        values = values.gather(-1, order).float()
        cand_cols = target_cols[cand]  # [R, N, k]

    prev = anchor_ids.long()
    state = None
    ids, rows, token_p, embeds = [], [], [], []
    for k in range(N):
        if topk is None:
            bias, embed, state = model.markov_step(prev, hidden[:, k], state)
            logits = base_logits[:, k].float() + bias.float()  # [R, Vd]
            cols = target_cols
        else:
            bias, embed, state = gathered_markov_step(model, prev, hidden[:, k], state, cand[:, k])
            logits = values[:, k] + bias.float()  # [R, k]
            cols = cand_cols[:, k]
        if on_slot_logits is not None:
            on_slot_logits(k, logits)
        if all_greedy:
            idx = logits.argmax(-1)  # [R] index into the sampling space
        else:
            key_pos = positions + (k - 1)  # the predecessor's position
            idx = gumbel_sample(
                logits, temperature, seeds, key_pos, stream=Stream.DRAFT, cols=cols, fp64=fp64
            )
        draft = idx if topk is None else cand[:, k].gather(1, idx.unsqueeze(1)).squeeze(1)
        x = model.map_draft_to_target(draft).long()  # [R] target ids
        if probs != "none":
            p = sampled_probs(logits, temperature)  # [R, C]
            rows.append(p)
            token_p.append(p.gather(1, idx.unsqueeze(1)).squeeze(1))
        if with_confidence:
            embeds.append(embed)
        ids.append(x)
        prev = x

    draft_ids = torch.stack(ids, dim=1)  # [R, N]
    draft_probs = None
    if probs != "none":
        # A full draft vocab has the identity d2t (the vocab map pins it), so it needs no cols.
        cols_all = cand_cols if topk is not None else (None if Vd == vocab_size else target_cols)
        draft_probs = DraftProbs(
            torch.stack(rows, dim=1), cols_all, torch.stack(token_p, dim=1), vocab_size
        )
        if probs == "target":
            draft_probs = DraftProbs(
                draft_probs.to_target(), None, draft_probs.token_probs, vocab_size
            )
    confidence = None
    if with_confidence:
        emb = torch.stack(embeds, dim=1).flatten(0, 1)  # [R * N, r], ordered (req, slot)
        confidence = model.compute_confidence(hidden.flatten(0, 1), emb).float().view(R, N)
    return MarkovWalkOutput(draft_ids, draft_probs, confidence)
