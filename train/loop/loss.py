"""The DSpark distillation loss (dspark.md), chunked over the vocabulary-sized part.

    loss = 0.1 * CE(data token) + 0.9 * L1(p_draft, p_teacher) + 1.0 * BCE(c_k, 1 - L1/2)

Each term is a masked, position-decayed (num, den) sum with w_k = exp(-k/4). Denominators depend
only on data and anchors, so `block_targets` computes them *before* the forward; the trainer
reduces them over every micro-batch of an accumulation window and every data-parallel rank, and
each micro-batch's loss is `num_local / den_global` (scaled for DDP's gradient averaging). That is
exactly the global ratio, divided last.

Metrics beside the loss, per draft position: 1 - TV, the acceptance at T=1 (analytic tau), and,
in evaluation (no gradient), whether the draft's argmax is the teacher's (greedy tau: the
acceptance a T=0 verifier gives in these contexts). On the target's own greedy answers the
second predicts realized T=0 acceptance; on sampled answers it is a proxy
(scripts/teacher_forced_acceptance.py walks the greedy answer itself).

The vocabulary-sized terms (CE, L1), chunked, with the teacher once per position and a closed-form
gradient: train/loop/vocab_loss.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from common.acceptance import chain_tau
from common.model import DSparkDraftModel, block_label_positions
from train.loop.vocab_loss import (
    VOCAB_GRAD_MODES,
    RowPlan,
    fused_vocab_loss,
    kept_rows,
    vocab_terms,
)

# The loss's terms, in the order of their weights (`loss_weights`).
LOSS_TERMS = ("ce", "l1", "bce")


def loss_weights(loss_cfg) -> tuple[float, float, float]:
    """The `loss` config's weights, in LOSS_TERMS order: what the loss and the logged figure use."""
    return (loss_cfg.ce_weight, loss_cfg.l1_weight, loss_cfg.bce_weight)


def weighted_loss(terms: dict[str, float], weights) -> float:
    """The logged loss from pooled terms (`summarize`); a term not there (bce without a
    confidence head) adds nothing."""
    return sum(w * terms.get(k, 0.0) for w, k in zip(weights, LOSS_TERMS, strict=True))


@dataclass
class BlockTargets:
    """Per (n, a, j): label position, label id, masks. Shapes [N, A, Nd]."""

    label_pos: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor  # in range & loss-masked, cumprod over j (float)
    ce_mask: torch.Tensor  # mask & label in draft vocab (float)
    decay: torch.Tensor  # [Nd] exp(-k / decay)
    # The loss's rows and chunks, decided ahead by a caller that wants no host sync in the loss
    # forward (train.loop.vocab_loss.plan_rows; None: the loss decides them).
    plan: RowPlan | None = None

    def dens(self) -> dict[str, torch.Tensor]:
        w = self.mask * self.decay
        return {"ce": (self.ce_mask * self.decay).sum(), "l1": w.sum(), "bce": w.sum()}


def block_targets(
    input_ids, loss_mask, anchors, anchor_valid, num_draft, t2d, decay=4.0, doc_ids=None
) -> BlockTargets:
    n, t = input_ids.shape
    j = torch.arange(num_draft, device=input_ids.device)
    label_pos, ok = block_label_positions(anchors, anchor_valid, num_draft, t, doc_ids)
    flat = label_pos.view(n, -1)
    ok &= loss_mask.gather(1, flat).view_as(label_pos).bool()
    mask = ok.long().cumprod(-1).float()
    labels = input_ids.gather(1, flat).view_as(label_pos)
    ce_mask = mask * t2d[labels].float()
    w = torch.exp(-j.double() / decay)  # fp64: the weights are exact constants, not data
    return BlockTargets(label_pos, labels, mask, ce_mask, w)


def distill_loss(
    model: DSparkDraftModel,
    fo,  # TrainForward
    tg: BlockTargets,
    teacher_final: torch.Tensor,  # [N, T, Ht] target post-norm hidden (no grad)
    teacher_lm_head: torch.Tensor,  # [V, Ht]
    dens: dict[str, torch.Tensor],  # global denominators (all ranks, whole accumulation window)
    weights=(0.1, 0.9, 1.0),
    chunk_tokens: int = 1024,
    confidence_detach: bool = True,
    vocab_grad: str = "fused",
    compiled: bool = False,
    share_teacher: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-> (loss to backprop, metric sums). Rows with zero mask are dropped before the vocab work.
    `compiled` (`trainer.compile_loss`): the fused path's chunks through `torch.compile`.
    `share_teacher`: the teacher once per position (module docstring); False: once per row."""
    if vocab_grad not in VOCAB_GRAD_MODES:
        raise ValueError(f"vocab_grad={vocab_grad!r}: choose one of {VOCAB_GRAD_MODES}")
    rows = kept_rows(model, fo, tg, teacher_final, share_teacher, chunk_tokens)
    h, e = rows.h, rows.e
    wmask = (tg.mask * tg.decay).view(-1).index_select(0, rows.idx)
    wce = (tg.ce_mask * tg.decay).view(-1).index_select(0, rows.idx)
    fused = None
    # T=0 agreement only where no gradient is taken (evaluation): the training step pays nothing.
    greedy = not torch.is_grad_enabled()
    if vocab_grad == "fused":
        coef_ce = weights[0] * wce / dens["ce"].clamp(min=1e-9)
        coef_l1 = weights[1] * wmask / dens["l1"].clamp(min=1e-9)
        fused, ce, l1, agree = fused_vocab_loss(
            model, rows, teacher_lm_head, coef_ce, coef_l1, chunk_tokens, greedy, compiled
        )
    else:
        ce, l1, agree = vocab_terms(
            model, rows, teacher_lm_head, chunk_tokens, checkpointed=True, greedy=greedy
        )

    accept = (1.0 - l1.detach() / 2).clamp(0, 1)  # 1 - TV
    nums = {"ce": (ce * wce).sum(), "l1": (l1 * wmask).sum()}
    conf = None
    if model.confidence_head is not None:
        ch, ce_in = (h.detach(), e.detach()) if confidence_detach else (h, e)
        c_logit = model.confidence_head.logits(ch, ce_in)
        bce = F.binary_cross_entropy_with_logits(c_logit, accept, reduction="none")
        nums["bce"] = (bce * wmask).sum()
        conf = torch.sigmoid(c_logit.detach())
    terms = ("bce",) if fused is not None else ("ce", "l1", "bce")
    loss = sum(
        wt * nums[k] / dens[k].clamp(min=1e-9)
        for wt, k in zip(weights, LOSS_TERMS, strict=True)
        if k in nums and k in terms
    )
    if fused is not None:
        loss = loss + fused
    metrics = block_metric_sums(tg, rows.idx, accept, conf, nums, agree)
    return loss, metrics


@torch.no_grad()
def block_metric_sums(tg: BlockTargets, idx, accept, conf, nums, agree) -> dict[str, torch.Tensor]:
    """(sum, count) pairs, reduced across ranks by the caller and divided last.

    acc_num/acc_den [Nd]: per-position conditional acceptance 1 - TV (T=1).
    greedy_num [Nd] (when agree is given): per-position argmax agreement with the teacher (T=0).
    conf_err: |c_k - (1 - TV_k)|; cum_bias: prod_{i<=k} c_i - prod_{i<=k}(1 - TV_i).
    """
    n, a, nd = tg.labels.shape
    full = torch.zeros(n * a * nd, device=accept.device, dtype=accept.dtype)
    full[idx] = accept
    acc = full.view(-1, nd)
    m = tg.mask.view(-1, nd)
    out = {
        "acc_num": (acc * m).sum(0),
        "acc_den": m.sum(0),
        "ce_num": nums["ce"].detach(),
        "l1_num": nums["l1"].detach(),
        "ce_den": (tg.ce_mask * tg.decay).sum(),
        "l1_den": (tg.mask * tg.decay).sum(),
    }
    if agree is not None:
        greedy = torch.zeros_like(full)
        greedy[idx] = agree.to(greedy.dtype)
        out["greedy_num"] = (greedy.view(-1, nd) * m).sum(0)
    if conf is not None:
        cfull = torch.zeros_like(full, dtype=conf.dtype)
        cfull[idx] = conf
        c = cfull.view(-1, nd)
        out["bce_num"] = nums["bce"].detach()
        out["conf_err_num"] = ((c - acc).abs() * m).sum(0)
        out["cum_bias_num"] = ((c.cumprod(-1) - acc.cumprod(-1)) * m).sum(0)
    return out


def summarize(sums: dict[str, torch.Tensor]) -> dict[str, float | list[float]]:
    """Pooled figures from reduced sums: per-position acceptance, analytic tau, loss terms."""
    den = sums["acc_den"].clamp(min=1)
    alpha = (sums["acc_num"] / den).tolist()
    out = {
        "acceptance_per_pos": alpha,
        "analytic_tau": chain_tau(alpha),
        "ce": float(sums["ce_num"] / sums["ce_den"].clamp(min=1e-9)),
        "l1": float(sums["l1_num"] / sums["l1_den"].clamp(min=1e-9)),
    }
    if "greedy_num" in sums:  # evaluation only
        greedy = (sums["greedy_num"] / den).tolist()
        out["greedy_acceptance_per_pos"] = greedy
        out["greedy_tau"] = chain_tau(greedy)
    if "bce_num" in sums:
        out["bce"] = float(sums["bce_num"] / sums["l1_den"].clamp(min=1e-9))
        out["conf_abs_err"] = float(sums["conf_err_num"].sum() / den.sum())
        out["conf_cumprod_bias"] = float(sums["cum_bias_num"].sum() / den.sum())
    return out


@torch.no_grad()
def block_acceptance(model, fo, tg: BlockTargets, teacher_final, teacher_lm_head, chunk=1024):
    """Per-slot acceptance 1 - TV(p_draft, p_teacher) -> [N, A, Nd] (0 where tg.mask is 0),
    with the same chunked terms as the loss. Used by calibration."""
    rows = kept_rows(model, fo, tg, teacher_final, chunk=chunk)
    _, l1, _ = vocab_terms(model, rows, teacher_lm_head, chunk, checkpointed=False)
    out = torch.zeros(rows.plan.size, dtype=l1.dtype, device=l1.device)
    out[rows.idx] = (1 - l1 / 2).clamp(0, 1)
    return out.view(tg.labels.shape)
