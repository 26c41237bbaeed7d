"""An independent loss oracle: SpecForge 0.2.0's own DSpark objective (`OnlineDSparkModel`,
which no one here wrote) against `train/loop/loss.py`, on the same batch, anchors, hidden states and
weights.

SpecForge's objective is called below its backbone (`_build_dspark_labels_and_mask`, then
`_compute_dspark_loss` on our draft's block hidden states) with SpecForge's own Markov and
confidence head classes holding our weights: what is compared is the loss, not the backbone (the
backbone is compared against speculators in test_speculators.py). Conventions that differ are
listed in docs/interop.md; each has a test here that shows the difference is the only one.
"""

from __future__ import annotations

import pytest
import torch
from specforge.algorithms.common.dflash_family_model import OnlineDSparkModel
from specforge.modeling.draft.dspark import (
    AcceptRatePredictor,
    GatedMarkovHead,
    RNNMarkovHead,
    VanillaMarkovHead,
)
from specforge.modeling.draft.dspark import DSparkDraftModel as SpecForgeDraft
from torch import nn

from common.config import MARKOV_HEAD_TYPES
from common.model.draft import TrainForward
from tests.conftest import tiny_model
from train.loop.loss import block_targets, distill_loss

pytestmark = pytest.mark.usefixtures("torch_single_thread")

WEIGHTS = (0.1, 0.9, 1.0)  # dspark.md; SpecForge's defaults are the same
DECAY = 4.0  # dspark.md PINNED w_k = exp(-k/4); SpecForge's default is no decay (gamma None)
RTOL = 1e-5  # fp32 (SpecForge upcasts to fp32 itself), different reduction order


class SpecForgeHeads(nn.Module):
    """SpecForge's DSpark heads and the two methods its objective calls, from its own classes;
    the backbone is not needed by the loss."""

    apply_logits_head = SpecForgeDraft.apply_logits_head
    predict_confidence = SpecForgeDraft.predict_confidence

    def __init__(self, ours):
        super().__init__()
        cfg = ours.config
        v, r, h = cfg.vocab_size, cfg.markov_rank, cfg.hidden_size
        kind = cfg.markov_head_type
        if kind == "vanilla":
            self.markov_head = VanillaMarkovHead(vocab_size=v, markov_rank=r)
        elif kind == "gated":
            self.markov_head = GatedMarkovHead(vocab_size=v, markov_rank=r, hidden_size=h)
        else:
            self.markov_head = RNNMarkovHead(vocab_size=v, markov_rank=r, hidden_size=h)
        self.confidence_head_with_markov = cfg.confidence_head_with_markov
        self.confidence_head = AcceptRatePredictor(cfg.confidence_input_size)
        mh = ours.markov_head
        theirs_from_ours = {
            "markov_head.markov_w1.weight": mh.markov_w1.weight,
            "markov_head.markov_w2.weight": mh.markov_w2.weight,
            "confidence_head.proj.weight": ours.confidence_head.proj.weight,
            "confidence_head.proj.bias": ours.confidence_head.proj.bias,
        }
        if kind == "gated":
            theirs_from_ours["markov_head.gate_proj.weight"] = mh.markov_gate.weight
            theirs_from_ours["markov_head.gate_proj.bias"] = mh.markov_gate.bias
        if kind == "rnn":
            theirs_from_ours["markov_head.joint_proj.weight"] = mh.markov_rnn.weight
            theirs_from_ours["markov_head.joint_proj.bias"] = mh.markov_rnn.bias
        self.load_state_dict({k: t.detach().clone() for k, t in theirs_from_ours.items()})


def batch(cfg, t: int = 20, n: int = 2):
    """Two sequences with loss-mask gaps (so the cumprod matters), anchors valid under both
    rules (loss_mask[p] & loss_mask[p+1]), one anchor whose block runs past the end, and one
    padding anchor."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (n, t), generator=g)
    loss_mask = torch.ones(n, t)
    loss_mask[0, :3] = 0
    loss_mask[0, 9] = 0
    loss_mask[1, 12:14] = 0
    anchors = torch.tensor([[3, 6, 17, 0], [1, 10, 14, 18]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    ok = (loss_mask.gather(1, anchors) > 0) & (loss_mask.gather(1, anchors + 1) > 0)
    assert bool((ok | ~valid).all())
    ctx = torch.randn(n, t, cfg.fc_input_size, generator=g)
    teacher_final = torch.randn(n, t, cfg.hidden_size, generator=g)  # SpecForge: one lm_head
    return ids, loss_mask, anchors, valid, ctx, teacher_final


def ours_and_specforge(markov_head_type: str, confidence_detach: bool, gamma=DECAY):
    model = tiny_model(markov_head_type=markov_head_type).float()
    with torch.no_grad():  # a trained-looking Markov output (tiny_model starts it small)
        model.markov_head.markov_w2.weight.normal_(0, 0.5)
        model.confidence_head.proj.weight.normal_(0, 0.5)
    cfg = model.config
    ids, loss_mask, anchors, valid, ctx, teacher_final = batch(cfg)
    b = cfg.block_size
    with torch.no_grad():
        fo = model.forward_train(ctx, ids, anchors, valid)

    # ours
    h = fo.hidden.detach().clone().requires_grad_(True)
    e, u = model.markov_inputs(fo.prev_ids, h)
    fo = TrainForward(h, fo.prev_ids, e, u)
    tg = block_targets(ids, loss_mask, anchors, valid, cfg.num_speculative_tokens, model.t2d, DECAY)
    loss, sums = distill_loss(
        model,
        fo,
        tg,
        teacher_final,
        model.lm_head.weight,
        tg.dens(),
        weights=WEIGHTS,
        chunk_tokens=16,
        confidence_detach=confidence_detach,
    )
    loss.backward()

    # SpecForge
    heads = SpecForgeHeads(model)
    sf = OnlineDSparkModel(
        draft_model=heads,
        target_lm_head=model.lm_head,
        target_embed_tokens=model.embed_tokens,
        mask_token_id=cfg.mask_token_id,
        block_size=b,
        attention_backend="sdpa",
        num_anchors=anchors.shape[1],
        loss_decay_gamma=gamma,
        dspark_ce_loss_alpha=WEIGHTS[0],
        dspark_l1_loss_alpha=WEIGHTS[1],
        dspark_confidence_head_alpha=WEIGHTS[2],
        objective_chunk_blocks=0,
    )
    target_ids, eval_mask, safe_idx = sf._build_dspark_labels_and_mask(
        ids, loss_mask, anchors, valid
    )
    prev = torch.cat([ids.gather(1, anchors).unsqueeze(-1), target_ids[:, :, :-1]], dim=-1)
    h_sf = h.detach().clone().requires_grad_(True)
    loss_sf, metrics = sf._compute_dspark_loss(
        output_hidden=h_sf.reshape(h.shape[0], -1, h.shape[-1]),
        target_ids=target_ids,
        eval_mask=eval_mask,
        prev_token_ids=prev,
        safe_label_indices=safe_idx,
        target_last_hidden_states=teacher_final,
    )
    loss_sf.backward()
    return dict(model=model, heads=heads, tg=tg, loss=loss, sums=sums, h=h), dict(
        target_ids=target_ids,
        eval_mask=eval_mask,
        prev=prev,
        loss=loss_sf,
        ratios=metrics["ratio_metrics"],
        h=h_sf,
    )


def close(a, b):
    torch.testing.assert_close(
        torch.as_tensor(a).double(), torch.as_tensor(b).double(), rtol=RTOL, atol=1e-7
    )


@pytest.mark.parametrize("kind", MARKOV_HEAD_TYPES)
def test_loss_terms_equal_specforge(kind):
    ours, sf = ours_and_specforge(kind, confidence_detach=False)
    tg = ours["tg"]
    # Same labels, same cumulative eval mask, same teacher-forced previous tokens.
    assert torch.equal(tg.mask.bool(), sf["eval_mask"])
    assert torch.equal(tg.labels[tg.mask.bool()], sf["target_ids"][sf["eval_mask"]])
    assert bool(tg.mask.sum() > 0) and bool((tg.mask == 0).any())
    r, s = sf["ratios"], ours["sums"]
    close(s["ce_num"], r["ce_loss"][0])
    close(s["l1_num"], r["l1_loss"][0])
    close(s["bce_num"], r["confidence_loss"][0])
    close(tg.dens()["l1"], r["l1_loss"][1])  # one denominator: sum_k w_k * mask
    close(tg.dens()["ce"], r["ce_loss"][1])  # full vocab: CE's own denominator is the same
    close(ours["loss"].detach(), sf["loss"].detach())
    # Gradients too (confidence_detach=False is SpecForge's convention).
    close(ours["h"].grad, sf["h"].grad)
    mh, th = ours["model"].markov_head, ours["heads"]
    close(mh.markov_w2.weight.grad, th.markov_head.markov_w2.weight.grad)
    close(ours["model"].confidence_head.proj.weight.grad, th.confidence_head.proj.weight.grad)


def test_confidence_detach_changes_only_the_backbone_gradient():
    """Ours detaches the confidence head's inputs by default (loss.confidence_detach=true): the
    loss value is SpecForge's, the gradient reaching the backbone lacks exactly the BCE path."""
    ours, sf = ours_and_specforge("vanilla", confidence_detach=True)
    close(ours["loss"].detach(), sf["loss"].detach())
    assert not torch.allclose(ours["h"].grad, sf["h"].grad, rtol=1e-4)
    close(
        ours["model"].confidence_head.proj.weight.grad,
        ours["heads"].confidence_head.proj.weight.grad,
    )


def test_specforge_default_without_decay_is_a_different_loss():
    """Negative control: with SpecForge's default `loss_decay_gamma=None` (no position decay)
    the oracle disagrees, so the equality above is not vacuous."""
    ours, sf = ours_and_specforge("vanilla", confidence_detach=False, gamma=None)
    assert abs(float(ours["loss"]) - float(sf["loss"])) > 1e-3
