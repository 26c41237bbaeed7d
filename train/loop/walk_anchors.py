"""Anchors where a greedily served draft starts its rounds (`trainer.anchor_sampling=walk`).

At T=0 a round anchored at p accepts the longest run of drafts equal to the target's argmax, say n,
and the next round is anchored at p + n + 1 (the target's own token after the last accepted draft).
Rounds therefore start only where the previous round ended, just past a rejection: on SmolLM2 those
anchors are harder than an anchor drawn at random (slot 0 accepted about half the time there against
about 0.62 over every anchor), and the uniform sampler of train/loop/anchors.py spends most of its
blocks where no round starts.

Here, per batch and with the draft as it is at this step: one no-grad, teacher-forced pass over
every valid anchor (the Markov head fed the true previous tokens, as in a round whose drafts so far
were accepted) gives n at every anchor; walking those counts from each answer's first token (the
anchor of its first round) marks the anchors the rounds visit; `num_anchors` are then drawn among
those alone (train/loop/anchors.py's keyed sampler). An untrained draft accepts nothing, so the walk
visits every anchor and this starts as uniform sampling.
"""

from __future__ import annotations

import numpy as np
import torch

from common.model import DSparkDraftModel
from train.loop.anchors import sample_anchors, valid_anchor_mask
from train.loop.loss import block_targets


@torch.no_grad()
def teacher_argmax(final: torch.Tensor, lm_head: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """[N, T] target id the target ranks first after each position (its T=0 token), from its final
    hidden states [N, T, Ht] and lm_head [V, Ht], `chunk` positions at a time (no [N*T, V] tensor).
    A final-logit soft cap is monotone, so it changes no argmax and is not applied."""
    n, t, _ = final.shape
    flat = final.reshape(n * t, -1)
    w = lm_head.to(flat.dtype)
    out = torch.empty(n * t, dtype=torch.long, device=final.device)
    for i in range(0, n * t, chunk):
        out[i : i + chunk] = (flat[i : i + chunk] @ w.T).argmax(-1)
    return out.view(n, t)


@torch.no_grad()
def draft_argmax(draft: DSparkDraftModel, fo, chunk: int = 8192) -> torch.Tensor:
    """[N, A, Nd] the draft's greedy id (draft vocab) in every slot of `fo` (forward_train's
    output, Markov input teacher-forced): `block_logits`, `chunk` rows at a time."""
    h = fo.hidden.flatten(0, -2)
    u = fo.markov_input.flatten(0, -2)  # flatten: r is 0 without a Markov head
    out = torch.cat(
        [
            draft.block_logits(h[i : i + chunk], u[i : i + chunk]).argmax(-1)
            for i in range(0, h.shape[0], chunk)
        ]
    )
    return out.view(fo.hidden.shape[:-1])


@torch.no_grad()
def accepted_counts(
    draft: DSparkDraftModel, aux, batch: dict, teacher_top: torch.Tensor, chunk_anchors: int
) -> torch.Tensor:
    """[N, T] long: at every valid anchor p, how many leading drafts of a block anchored there a
    greedy verifier accepts (the draft's argmax equal to the target's, within the answer); -1 at
    positions that cannot anchor a block. Anchors go through the draft `chunk_anchors` at a time,
    each chunk padded to exactly that many (the training step's shape, so a compiled draft is not
    compiled again)."""
    ids, lm = batch["input_ids"], batch["loss_mask"]
    doc_ids, pos_ids = batch.get("doc_ids"), batch.get("position_ids")
    n, t = ids.shape
    ok = valid_anchor_mask(lm, doc_ids)
    # every valid position of a row, in order, then padding (position 0, marked invalid)
    order = torch.where(ok, torch.arange(t, device=ids.device), t).sort(dim=1).values
    count = int(ok.sum(1).max())
    counts = torch.full((n, t), -1, dtype=torch.long, device=ids.device)
    top_d = draft.map_target_to_draft(teacher_top)  # [N, T] draft id of the target's argmax
    nd = draft.config.num_speculative_tokens
    for lo in range(0, count, chunk_anchors):
        cols = order[:, lo : lo + chunk_anchors]
        if cols.shape[1] < chunk_anchors:
            cols = torch.cat([cols, cols.new_full((n, chunk_anchors - cols.shape[1]), t)], 1)
        valid = cols < t
        anchors = torch.where(valid, cols, 0)
        fo = draft.forward_train(aux, ids, anchors, valid, position_ids=pos_ids, doc_ids=doc_ids)
        tg = block_targets(ids, lm, anchors, valid, nd, draft.t2d, doc_ids=doc_ids)
        want = top_d.gather(1, (tg.label_pos - 1).view(n, -1)).view_as(tg.label_pos)
        hit = (draft_argmax(draft, fo) == want) & (tg.mask > 0)
        accepted = leading_matches(hit)  # [N, A]
        rows = torch.arange(n, device=ids.device).unsqueeze(1).expand_as(anchors)
        counts[rows[valid], anchors[valid]] = accepted[valid]
    return counts


def leading_matches(hit: torch.Tensor) -> torch.Tensor:
    """[..., Nd] bool -> [...]: the drafts a T=0 round anchored there accepts (its leading hits)."""
    return hit.long().cumprod(-1).sum(-1)


def round_starts(counts) -> list[tuple[int, int]]:
    """(anchor, accepted) of each greedy round over an answer of len(counts) tokens, from the
    drafts each anchor would have accepted: anchor 0 (the first answer token, which the target
    wrote), then a + 1 further after accepting a; a round starts while the answer has tokens
    after its anchor."""
    p, out = 0, []
    while p < len(counts) - 1:
        a = int(counts[p])
        out.append((p, a))
        p += a + 1
    return out


def answer_spans(loss_mask: torch.Tensor, doc_ids: torch.Tensor | None = None):
    """(row, start, end) of every answer: a run of loss-masked tokens within one document."""
    lm = loss_mask.bool().cpu().numpy()
    n, t = lm.shape
    edge = np.zeros((n, t + 1), dtype=bool)  # a run may start or end between i - 1 and i
    edge[:, 0], edge[:, t] = True, True
    edge[:, 1:t] = lm[:, 1:] != lm[:, :-1]
    if doc_ids is not None:
        d = doc_ids.cpu().numpy()
        edge[:, 1:t] |= d[:, 1:] != d[:, :-1]
    spans = []
    for row in range(n):
        cuts = np.nonzero(edge[row])[0]
        spans += [(row, int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if lm[row, a]]
    return spans


def walk_visits(
    counts: torch.Tensor, loss_mask: torch.Tensor, doc_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """[N, T] bool: the anchors greedy rounds visit (`round_starts` over each answer's counts,
    `accepted_counts`)."""
    c = counts.cpu().numpy()
    visited = np.zeros(c.shape, dtype=bool)
    for row, start, end in answer_spans(loss_mask, doc_ids):
        for p, _ in round_starts(c[row, start:end]):
            visited[row, start + p] = True
    return torch.from_numpy(visited).to(counts.device)


def walk_anchors(
    draft: DSparkDraftModel,
    aux,
    final,
    teacher_lm_head,
    batch: dict,
    num_anchors: int,
    seed: int,
    step: int,
    host: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (anchors [N, num_anchors], valid, visited [N, T]): up to `num_anchors` anchors a row,
    drawn uniformly among those its greedy rounds visit (padding marked invalid; always
    `num_anchors` columns, so the training step keeps one shape). `host`: the batch's CPU copy
    where the caller has one (else copied here)."""
    top = teacher_argmax(final, teacher_lm_head)
    counts = accepted_counts(draft, aux, batch, top, num_anchors)
    visited = walk_visits(counts, batch["loss_mask"], batch.get("doc_ids"))
    keys = ("loss_mask", "input_ids", "doc_ids")
    cpu = host if host is not None else {k: batch[k].cpu() for k in keys if k in batch}
    anchors, valid = sample_anchors(
        cpu["loss_mask"],
        num_anchors,
        seed,
        step,
        cpu["input_ids"],
        cpu.get("doc_ids"),
        allowed=visited.cpu(),
        pad_to=num_anchors,
    )
    return anchors.to(counts.device), valid.to(counts.device), visited
