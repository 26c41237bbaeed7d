"""The vocabulary-sized part of the distillation loss (train/loop/loss.py), chunked: the draft's
logits over its vocabulary and the teacher's over the target's, CE and L1 per supervised row.

Memory: draft and teacher logits exist only for `chunk_tokens` rows at a time, so no
`[tokens, vocab]` fp32 tensor is ever built for all anchors at once. Teacher logits are computed
only at the supervised rows' label-1 positions, in the model dtype, softmax in fp32 per chunk,
and once per position: overlapping blocks share label positions (512 anchors of 7 slots in a
2,048-token row cover a position 1.75 times on average; on SmolLM2's training rows the kept rows
read 0.343 distinct positions each), so the kept rows are ordered by their
teacher position and each chunk's teacher work runs over the distinct positions it reads
(`share_teacher`; False computes it per row, the same numbers, for benchmarks).
Gradient of the vocab-sized part (`vocab_grad`):
- "fused" (default): each chunk's gradient with respect to the logits is written down in closed
  form in the forward pass (CE: p - onehot; L1: p * (s - <s, p>), s = sign(p - q)) and turned into
  d/d[h; u] and d/d markov_w2 right there; the backward pass only scales them. Teacher and draft
  logits are computed once, and no gradient is formed for the frozen lm_head.
- "checkpoint": autograd through `_chunk_terms` under activation checkpointing (the backward
  recomputes teacher and draft logits per chunk). Same gradient; kept as the reference.
Teacher: softmax over the FULL target vocab even with a reduced draft vocab (PINNED); teacher mass
outside the draft vocab counts as disagreement in L1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from common.model import DSparkDraftModel
from common.target import softcap_logits
from train.loop.phases import phase

VOCAB_GRAD_MODES = ("fused", "checkpoint")


def _atleast_f32(x: torch.Tensor) -> torch.Tensor:
    """Upcast bf16/fp16 for the softmax; keep fp32/fp64 (tests compare in float64)."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _teacher_probs_of(teacher_h, w_teacher, sel, softcap=None, greedy=False, rows=None):
    """teacher_h [u, Ht] -> (p_t over the draft vocab [c, Vd], teacher mass outside it [c], top):
    with `greedy`, top [c] is the draft id of the teacher's argmax over the FULL vocab (-1 where it
    lies outside the draft vocab), else None. `rows` [c]: each output row's index into teacher_h
    (None: one output row per teacher_h row, c = u). `softcap`: the target's final-logit soft
    cap (Gemma), applied to the teacher logits only. No timing mark: `torch.compile` traces it."""
    z_t = _atleast_f32(teacher_h @ w_teacher.T.to(teacher_h.dtype))
    p_t = torch.softmax(softcap_logits(z_t, softcap), dim=-1)
    p_t_sel = p_t if sel is None else p_t.index_select(1, sel)
    top = None
    if greedy:
        best_sel = p_t_sel.max(-1)
        top = best_sel.indices
        if sel is not None:  # a reduced vocab: is the full-vocab best among its ids?
            top = torch.where(best_sel.values >= p_t.max(-1).values, top, -1)
    outside = 1.0 - p_t_sel.sum(-1)  # the mass the draft cannot express
    if rows is not None:
        p_t_sel, outside = p_t_sel.index_select(0, rows), outside.index_select(0, rows)
        top = None if top is None else top.index_select(0, rows)
    return p_t_sel, outside, top


@torch.no_grad()
def _teacher_probs(teacher_h, w_teacher, sel, softcap=None, greedy=False, rows=None):
    """`_teacher_probs_of` under the "teacher_logits" timing mark."""
    with phase("teacher_logits"):
        return _teacher_probs_of(teacher_h, w_teacher, sel, softcap, greedy, rows)


def _chunk_terms(
    hu, teacher_h, teacher_rows, labels_d, w_fused, w_teacher, sel, softcap=None, greedy=False
):
    """One chunk: hu [c, H+r], teacher_h [u, Ht] with teacher_rows [c] (or None, u = c: see
    `_teacher_probs_of`), labels_d [c] (draft id or -1)
    -> (ce [c], l1 [c]) fp32 and, with `greedy`, agree [c] bool (greedy_agreement; else None).
    `sel` [Vd] target ids of the draft vocab (None = full vocab); `softcap`: the target's
    final-logit soft cap (Gemma), applied to the teacher logits only."""
    logp_d = torch.log_softmax(_atleast_f32(hu @ w_fused.T.to(hu.dtype)), dim=-1)  # [c, Vd]
    p_t_sel, outside, top = _teacher_probs(teacher_h, w_teacher, sel, softcap, greedy, teacher_rows)
    l1 = (logp_d.exp() - p_t_sel).abs().sum(-1) + outside.clamp(min=0)
    ce = -logp_d.gather(1, labels_d.clamp(min=0).unsqueeze(1)).squeeze(1)
    return ce, l1, None if top is None else greedy_agreement(logp_d, top)


@torch.no_grad()
def greedy_agreement(draft_scores: torch.Tensor, teacher_top: torch.Tensor) -> torch.Tensor:
    """[c] bool: the draft's argmax (its T=0 token) is the teacher's argmax over the full vocab,
    i.e. a greedy verifier accepts it in this context (teacher_top -1: outside the draft vocab,
    never accepted)."""
    return draft_scores.argmax(-1) == teacher_top


def _cat(parts: list, like: torch.Tensor, dtype) -> torch.Tensor | None:
    """Chunks' results as one tensor (empty when there were no rows; None when not computed)."""
    if parts and parts[0] is None:
        return None
    return torch.cat(parts) if parts else like.new_zeros(0, dtype=dtype)


@dataclass
class RowPlan:
    """Which draft rows of a batch the loss reads and how it chunks them, decided from the block
    targets alone (no draft output), so a trainer can decide it for its next step while the device
    runs this one and the loss forward makes no host sync (this takes three).
    size: N*A*Nd rows in all; idx [M] the supervised (mask > 0) ones, ordered by teacher position;
    tpos [U] the teacher positions they read in the flattened [N*seq_len] states, and teacher_row
    [M] each row's index into tpos (nondecreasing; None: tpos has one entry per row, unshared);
    spans: per `chunk` rows, (their slice, the slice of tpos they read, each row's index into
    that slice or None)."""

    size: int
    idx: torch.Tensor
    tpos: torch.Tensor
    teacher_row: torch.Tensor | None
    key: tuple[int, bool, int]  # (seq_len, share_teacher, chunk) it was made for
    spans: list[tuple[slice, slice, torch.Tensor | None]]


def plan_rows(tg, seq_len: int, share_teacher: bool, chunk: int) -> RowPlan:
    """The `RowPlan` of `tg` (train.loop.loss.BlockTargets) for teacher states of `seq_len`
    positions
    a row, `share_teacher` (the teacher once per position) and loss chunks of `chunk` rows."""
    keep = tg.mask.view(-1) > 0
    idx = keep.nonzero().squeeze(1)  # boolean indexing would sync once per tensor
    tpos = teacher_positions_of(tg, seq_len).index_select(0, idx)
    teacher_row = None
    if share_teacher:  # rows that read one position side by side, the position once in tpos
        tpos, order = tpos.sort(stable=True)
        idx = idx.index_select(0, order)
        tpos, teacher_row = torch.unique_consecutive(tpos, return_inverse=True)
    spans = chunk_spans(idx.numel(), teacher_row, chunk)
    return RowPlan(keep.numel(), idx, tpos, teacher_row, (seq_len, share_teacher, chunk), spans)


@dataclass
class KeptRows:
    """The supervised draft rows of a batch (`plan`), flattened (M rows): h [M, H];
    e = W1[prev] [M, r]; hu = [h; u] [M, H+r] (u: Markov bias input); th [U, Ht] the teacher's
    final hidden at the positions the plan reads; labels_d [M] draft id of the data token (-1
    outside the draft vocab); sel [Vd] target ids of the draft vocab (None: full vocab)."""

    plan: RowPlan
    h: torch.Tensor
    e: torch.Tensor
    hu: torch.Tensor
    th: torch.Tensor
    labels_d: torch.Tensor
    sel: torch.Tensor | None

    @property
    def idx(self) -> torch.Tensor:
        return self.plan.idx

    @property
    def teacher_row(self) -> torch.Tensor | None:
        return self.plan.teacher_row

    def chunks(self, size: int) -> list[tuple[slice, slice, torch.Tensor | None]]:
        """Per `size` rows: (their slice, the slice of th they read, each row's index into that
        slice, or None where th is per row); the plan's own when it was made for `size`."""
        if self.plan.key[2] == size:
            return self.plan.spans
        return chunk_spans(self.plan.idx.numel(), self.plan.teacher_row, size)


def chunk_spans(
    m: int, teacher_row: torch.Tensor | None, chunk: int
) -> list[tuple[slice, slice, torch.Tensor | None]]:
    """`RowPlan.spans` of `m` rows in chunks of `chunk` (one host sync where rows share)."""
    spans = [(s, min(s + chunk, m)) for s in range(0, m, chunk)]
    if teacher_row is None:
        return [(slice(s, e), slice(s, e), None) for s, e in spans]
    if not spans:
        return []
    ends = torch.tensor([[s, e - 1] for s, e in spans], device=teacher_row.device)
    bounds = teacher_row[ends].tolist()
    return [
        (slice(s, e), slice(u0, u1 + 1), teacher_row[s:e] - u0)
        for (s, e), (u0, u1) in zip(spans, bounds, strict=True)
    ]


def teacher_positions_of(tg, seq_len: int) -> torch.Tensor:
    """[N*A*Nd]: where each draft row of `tg` (train.loop.loss.BlockTargets) reads the teacher,
    row n's
    label_pos - 1 in the teacher states flattened to [N*seq_len]."""
    n = tg.labels.shape[0]
    rows = torch.arange(n, device=tg.label_pos.device)[:, None] * seq_len
    return (tg.label_pos.reshape(n, -1) - 1 + rows).reshape(-1)


def shared_teacher_counts(tg, seq_len: int) -> tuple[int, int]:
    """-> (supervised draft rows, distinct teacher positions they read): with `share_teacher`
    the loss computes the teacher for the second many rows instead of the first."""
    kept = teacher_positions_of(tg, seq_len)[tg.mask.view(-1) > 0]
    return kept.numel(), kept.unique().numel()


def kept_rows(
    model: DSparkDraftModel, fo, tg, teacher_final, share_teacher: bool = True, chunk: int = 1024
) -> KeptRows:
    """The supervised rows of `tg` (train.loop.loss.BlockTargets) with the draft's outputs `fo` and
    the teacher's final hidden states [N, T, Ht] at the positions they read: by `tg.plan` where
    the caller decided it for these settings ahead, else planned here."""
    n, t = teacher_final.shape[:2]
    plan = tg.plan
    if plan is None or plan.key[:2] != (t, share_teacher):
        plan = plan_rows(tg, t, share_teacher, chunk)
    idx = plan.idx
    th = teacher_final.reshape(n * t, -1).index_select(0, plan.tpos)
    # flatten, not reshape(-1, r): r is 0 for a DFlash draft (no Markov head).
    h = fo.hidden.flatten(0, -2).index_select(0, idx)
    u = fo.markov_input.flatten(0, -2).index_select(0, idx)
    e = fo.markov_embed.flatten(0, -2).index_select(0, idx)
    labels = tg.labels.reshape(-1).index_select(0, idx)
    labels_d = model.map_target_to_draft(labels)
    sel = model.draft_ids_in_target if model.config.reduced_vocab else None
    hu = torch.cat([h, u.to(h.dtype)], dim=-1)
    return KeptRows(plan, h, e, hu, th, labels_d, sel)


def vocab_terms(
    model, rows: KeptRows, teacher_lm_head, chunk: int, checkpointed: bool, greedy=False
):
    """(ce [M], l1 [M], agree [M] or None) over `chunk` rows at a time (`greedy`: see
    _chunk_terms); `checkpointed` recomputes each chunk in the backward pass instead of keeping
    its [chunk, vocab] tensors."""
    w_fused = model.fused_head_weight()
    fixed = (w_fused, teacher_lm_head, rows.sel, model.config.target_logit_softcap, greedy)
    ces, l1s, agrees = [], [], []
    for r, u, ur in rows.chunks(chunk):
        args = (rows.hu[r], rows.th[u], ur, rows.labels_d[r], *fixed)
        ce, l1, agree = (
            checkpoint(_chunk_terms, *args, use_reentrant=False)
            if checkpointed
            else _chunk_terms(*args)
        )
        ces.append(ce)
        l1s.append(l1)
        agrees.append(agree)
    like = rows.hu
    return _cat(ces, like, like.dtype), _cat(l1s, like, like.dtype), _cat(agrees, like, torch.bool)


def _fused_chunk(
    x,
    w,
    teacher_h,
    teacher_rows,
    w_teacher,
    sel,
    softcap,
    labels_d,
    coef_ce,
    coef_l1,
    greedy,
    teacher=_teacher_probs,
):
    """One chunk of `_FusedVocabLoss`: x = hu rows [c, H+r], w the fused head [Vd, H+r],
    teacher_h [u, Ht] with teacher_rows [c] (or None: see `_teacher_probs_of`) ->
    (g = dS/d logits [c, Vd] in x's dtype, ce [c], l1 [c], agree [c] or None). `teacher`:
    the teacher-probability function, the timed `_teacher_probs` by default; the compiled
    chunk (`compiled_fused_chunk`) takes `_teacher_probs_of`, which has no timing mark, so
    `torch.compile` traces the chunk whole."""
    logp = torch.log_softmax(_atleast_f32(x @ w.T), dim=-1)  # [c, Vd]
    p = logp.exp()
    p_t_sel, outside, top = teacher(teacher_h, w_teacher, sel, softcap, greedy, teacher_rows)
    sign = torch.sign(p - p_t_sel)
    l1 = (p - p_t_sel).abs().sum(-1) + outside.clamp(min=0)
    lab = labels_d.clamp(min=0).unsqueeze(1)
    ce = -logp.gather(1, lab).squeeze(1)
    cc, cl = coef_ce.to(p.dtype), coef_l1.to(p.dtype)
    # d S / d logits: L1 part p * (s - <s, p>), CE part p - onehot(label).
    g = p * (sign - (sign * p).sum(-1, keepdim=True)) * cl.unsqueeze(1)
    g = g + p * cc.unsqueeze(1)
    g = g.scatter_add(1, lab, -cc.unsqueeze(1))
    return g.to(x.dtype), ce, l1, greedy_agreement(logp, top) if greedy else None


@functools.cache
def compiled_fused_chunk(backend: str = "inductor"):
    """`_fused_chunk` under `torch.compile` (`trainer.compile_loss`): the elementwise passes
    over each [chunk, vocab] tensor (upcast, softmax, index_select, sign, |p - q|, the gradient)
    fuse into a few kernels. The kept rows, and so the last chunk's length, change every step:
    the first call compiles for its shape and the first other length recompiles once with a
    dynamic row count (torch.compile's default), never once per step. The teacher logits are
    not timed apart here."""
    chunk = functools.partial(_fused_chunk, teacher=_teacher_probs_of)
    return torch.compile(chunk, backend=backend, fullgraph=True)


class _FusedVocabLoss(torch.autograd.Function):
    """S = sum_rows(coef_ce * ce + coef_l1 * l1) chunk by chunk (`KeptRows.chunks`), its gradient
    with respect to hu [M, H+r] and markov_w2 [Vd, r] formed in the forward pass (module docstring).
    Also returns ce [M], l1 [M] and agree [M] (no gradient; empty unless `greedy`) for the
    metrics and the confidence target."""

    @staticmethod
    def forward(
        ctx,
        hu,
        w_markov,
        w_fused,
        teacher_h,
        w_teacher,
        labels_d,
        sel,
        coef_ce,
        coef_l1,
        chunks,
        softcap,
        greedy,
        chunk_fn,
    ):
        r = 0 if w_markov is None else w_markov.shape[1]
        ghu = torch.empty_like(hu)
        gw2 = (
            None
            if w_markov is None
            else torch.zeros(
                w_markov.shape,
                dtype=torch.promote_types(w_markov.dtype, torch.float32),
                device=hu.device,
            )
        )
        total = hu.new_zeros((), dtype=torch.float64)
        ces, l1s, agrees = [], [], []
        w = w_fused.to(hu.dtype)
        for rs, us, urows in chunks:
            x = hu[rs]
            g, ce, l1, agree = chunk_fn(
                x,
                w,
                teacher_h[us],
                urows,
                w_teacher,
                sel,
                softcap,
                labels_d[rs],
                coef_ce[rs],
                coef_l1[rs],
                greedy,
            )
            ghu[rs] = g @ w
            if gw2 is not None:
                gw2 += (g.T @ x[:, x.shape[1] - r :]).to(gw2.dtype)
            total += (coef_ce[rs] * ce).sum() + (coef_l1[rs] * l1).sum()
            ces.append(ce)
            l1s.append(l1)
            if greedy:
                agrees.append(agree)
        ce_all = _cat(ces, hu, torch.float32)
        l1_all = _cat(l1s, hu, torch.float32)
        agree_all = _cat(agrees, hu, torch.bool)
        ctx.save_for_backward(ghu, gw2)
        ctx.w_markov_dtype = None if w_markov is None else w_markov.dtype
        ctx.mark_non_differentiable(ce_all, l1_all, agree_all)
        return total, ce_all, l1_all, agree_all

    @staticmethod
    def backward(ctx, g_total, _g_ce, _g_l1, _g_agree):
        ghu, gw2 = ctx.saved_tensors
        d_hu = ghu * g_total.to(ghu.dtype) if ctx.needs_input_grad[0] else None
        d_w2 = None
        if gw2 is not None and ctx.needs_input_grad[1]:
            d_w2 = (gw2 * g_total.to(gw2.dtype)).to(ctx.w_markov_dtype)
        return d_hu, d_w2, *([None] * 11)


def fused_vocab_loss(
    model,
    rows: KeptRows,
    teacher_lm_head,
    coef_ce,
    coef_l1,
    chunk: int,
    greedy=False,
    compiled=False,
):
    """-> (S with gradient, ce [M], l1 [M], agree [M] or None); S = sum(coef_ce * ce + coef_l1 *
    l1); agree (`greedy`): see _chunk_terms. `compiled`: each chunk through
    `compiled_fused_chunk()`."""
    w_markov = model.markov_head.markov_w2.weight if model.markov_head is not None else None
    with torch.no_grad():
        w_fused = model.fused_head_weight()
    out = _FusedVocabLoss.apply(
        rows.hu,
        w_markov,
        w_fused,
        rows.th,
        teacher_lm_head,
        rows.labels_d,
        rows.sel,
        coef_ce,
        coef_l1,
        rows.chunks(chunk),
        model.config.target_logit_softcap,
        greedy,
        compiled_fused_chunk() if compiled else _fused_chunk,
    )
    return (*out[:3], out[3] if greedy else None)
