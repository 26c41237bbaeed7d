"""DSparkDraftModel: Markov/confidence heads against explicit formulas, and the training forward
(all anchor blocks in one pass) against the inference path run block by block, slot by slot."""

from __future__ import annotations

import itertools

import pytest
import torch

from common.config import MARKOV_HEAD_TYPES
from common.model import block_label_positions, inference_block_mask
from common.model.layers import RMSNorm, rope
from tests.conftest import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")

HEADS = MARKOV_HEAD_TYPES


# ---------------------------------------------------------------- layers
def test_norm_and_rope_compute_in_float64_for_a_float64_model():
    """The fp64 equivalence tests below are only as tight as these two primitives."""
    torch.manual_seed(0)
    norm = RMSNorm(8, 1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(8, dtype=torch.float64) + 0.5)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), ref, rtol=1e-14, atol=1e-14)
    pos = torch.tensor([[0, 1, 7, 1000]])
    q = torch.randn(1, 4, 2, 8, dtype=torch.float64)  # [N, S, heads, hd]
    inv = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    ang = pos[..., None, None].double() * inv  # [N, S, 1, hd/2]
    q1, q2 = q[..., :4], q[..., 4:]
    ref = torch.cat([q1 * ang.cos() - q2 * ang.sin(), q2 * ang.cos() + q1 * ang.sin()], -1)
    torch.testing.assert_close(rope(q, pos, 10000.0), ref, rtol=1e-14, atol=1e-14)
    # bf16 inputs are still normalised in fp32 and returned in bf16.
    assert norm.to(torch.bfloat16)(x.to(torch.bfloat16)).dtype == torch.bfloat16


# ---------------------------------------------------------------- heads
def test_vanilla_bias_is_w2_of_w1_prev():
    model = tiny_model(draft_vocab_size=40).double()
    mh = model.markov_head
    prev = torch.tensor([0, 7, 95, 31])  # target ids, including ids outside the draft vocab
    h = torch.randn(4, 32, dtype=torch.float64)
    expected = mh.markov_w1.weight[prev] @ mh.markov_w2.weight.T  # [R, Vd]
    bias, e, state = model.markov_step(prev, h)
    assert bias.shape == (4, 40) and state is None
    torch.testing.assert_close(bias, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(e, mh.markov_w1.weight[prev], rtol=0, atol=0)
    torch.testing.assert_close(model.markov_bias(model.markov_embed(prev)), expected)
    # The vanilla bias ignores the hidden state.
    torch.testing.assert_close(model.markov_step(prev, torch.randn_like(h))[0], bias)


def test_gated_bias_shape_formula_and_dependence_on_h():
    model = tiny_model(markov_head_type="gated").double()
    mh = model.markov_head
    prev, h = torch.tensor([3, 4, 5]), torch.randn(3, 32, dtype=torch.float64)
    bias, e, _ = model.markov_step(prev, h)
    assert bias.shape == (3, 96)
    g = torch.sigmoid(torch.cat([h, e], -1) @ mh.markov_gate.weight.T + mh.markov_gate.bias)
    torch.testing.assert_close(bias, (g * e) @ mh.markov_w2.weight.T)
    bias2 = model.markov_step(prev, h + torch.randn_like(h))[0]
    assert (bias2 - bias).abs().amax(-1).min() > 1e-6  # every row moved


def test_rnn_bias_depends_on_h_and_only_on_the_prefix():
    model = tiny_model(markov_head_type="rnn").double()
    mh = model.markov_head
    n = 4
    prev = torch.tensor([[5, 9, 11, 13]])  # [1, N]
    h = torch.randn(1, n, 32, dtype=torch.float64)
    e, u = mh.teacher_forced(prev, h)
    assert e.shape == u.shape == (1, n, 8)
    # Sequential steps from s_0 = 0 reproduce the teacher-forced pass, with the explicit cell.
    state = torch.zeros(1, 8, dtype=torch.float64)
    for k in range(n):
        z = torch.cat([state, e[:, k], h[:, k]], -1) @ mh.markov_rnn.weight.T + mh.markov_rnn.bias
        gate, cand, out = z.chunk(3, -1)
        state = torch.sigmoid(gate) * state + (1 - torch.sigmoid(gate)) * torch.tanh(cand)
        torch.testing.assert_close(u[:, k], torch.tanh(out))
        bias_k = model.markov_step(prev[:, k], h[:, k], state if k else None)[0]
        assert bias_k.shape == (1, 96)
    # Changing the previous token at slot 1 changes u at slots >= 1 only (causal recurrence).
    prev2 = prev.clone()
    prev2[0, 1] = 50
    _, u2 = mh.teacher_forced(prev2, h)
    torch.testing.assert_close(u2[:, 0], u[:, 0], rtol=0, atol=0)
    assert ((u2 - u)[:, 1:].abs().amax(-1) > 1e-9).all()
    # Changing h at slot 2 changes u at slots >= 2 only.
    h2 = h.clone()
    h2[0, 2] += 1.0
    _, u3 = mh.teacher_forced(prev, h2)
    torch.testing.assert_close(u3[:, :2], u[:, :2], rtol=0, atol=0)
    assert ((u3 - u)[:, 2:].abs().amax(-1) > 1e-9).all()


@pytest.mark.parametrize("with_markov", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_confidence_head(with_markov, dtype):
    model = tiny_model(confidence_head_with_markov=with_markov, dtype=dtype)
    proj = model.confidence_head.proj
    h, e = torch.randn(5, 32).to(dtype), torch.randn(5, 8).to(dtype)
    c = model.compute_confidence(h, e)
    assert c.shape == (5,) and c.dtype == torch.promote_types(dtype, torch.float32)
    x = torch.cat([h, e], -1) if with_markov else h
    ref = torch.sigmoid(x.double() @ proj.weight.double().T + proj.bias.double()).squeeze(-1)
    torch.testing.assert_close(c.double(), ref, rtol=0, atol=1e-6)


def test_map_draft_to_target():
    model = tiny_model(draft_vocab_size=40)
    ids = torch.arange(40)
    tgt = model.map_draft_to_target(ids)
    assert torch.equal(tgt, ids + model.d2t)
    assert model.t2d[tgt].all() and int(model.t2d.sum()) == 40
    assert torch.equal(tiny_model().map_draft_to_target(ids), ids)


def test_map_target_to_draft_inverts_the_map_and_marks_the_rest():
    model = tiny_model(draft_vocab_size=40)
    ids = torch.arange(40)
    assert torch.equal(model.map_target_to_draft(model.map_draft_to_target(ids)), ids)
    outside = (~model.t2d).nonzero().flatten()
    assert outside.numel() > 0 and (model.map_target_to_draft(outside) == -1).all()
    full = torch.arange(model.config.vocab_size)
    assert torch.equal(tiny_model().map_target_to_draft(full), full)


def test_compute_draft_logits_local_shards_concatenate():
    model = tiny_model(draft_vocab_size=41)
    h = torch.randn(3, 32)
    full = model.compute_draft_logits(h)
    shards = [model.compute_draft_logits_local(h, r, 4) for r in range(4)]  # 11 columns each
    cat = torch.cat(shards, -1)
    torch.testing.assert_close(cat[:, :41], full)
    assert torch.isneginf(cat[:, 41:]).all()


# ---------------------------------------------------------------- training == inference
def reference_block_logits(model, ctx_states, input_ids, p, position_ids, doc_start):
    """The inference path for ONE sequence and anchor p: context K/V over the anchor's document
    positions [doc_start, p), one backbone pass over [x_p, MASK...], then the sequential Markov
    loop with teacher-forced previous tokens x_{p+j}. -> [Nd, Vd]."""
    cfg = model.config
    b, off = cfg.block_size, cfg.draft_slot_offset
    c = p - doc_start
    kv = model.context_kv(ctx_states[None, doc_start:p], position_ids[None, doc_start:p])
    blk_ids = model.block_input_ids(input_ids[p].view(1))  # [1, B]
    blk_pos = (position_ids[p] + torch.arange(b)).view(1, b)
    mask = inference_block_mask(torch.tensor([c]), c, b)  # [1, B, C+B]
    h = model.backbone(blk_ids, blk_pos, kv, mask)[0]  # [B, H]
    rows, state = [], None
    for j in range(cfg.num_speculative_tokens):
        hs = h[off + j].view(1, -1)
        bias, _, state = model.markov_step(input_ids[p + j].view(1), hs, state)
        rows.append(model.compute_draft_logits(hs) + bias)
    return torch.cat(rows)


def run_equivalence(model, anchors, doc_ids=None, position_ids=None, seed=0):
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    n, t = anchors.shape[0], 16
    ctx = torch.randn(n, t, cfg.fc_input_size, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size - 1, (n, t), generator=gen)
    valid = torch.ones_like(anchors, dtype=torch.bool)
    out = model.forward_train(ctx, ids, anchors, valid, position_ids, doc_ids)
    logits = model.block_logits(out.hidden, out.markov_input)  # [N, A, Nd, Vd]
    assert logits.shape == (n, anchors.shape[1], cfg.num_speculative_tokens, cfg.draft_vocab)
    pos = torch.arange(t).expand(n, t) if position_ids is None else position_ids
    for i, a in itertools.product(range(n), range(anchors.shape[1])):
        p = int(anchors[i, a])
        start = 0 if doc_ids is None else int((doc_ids[i] == doc_ids[i, p]).nonzero()[0])
        ref = reference_block_logits(model, ctx[i], ids[i], p, pos[i], start)
        torch.testing.assert_close(logits[i, a], ref, rtol=1e-9, atol=1e-9)
        nd = cfg.num_speculative_tokens
        assert out.prev_ids[i, a].tolist() == ids[i, p : p + nd].tolist()
    return out


@pytest.mark.parametrize("sfa", [True, False], ids=["anchor_first", "bonus_anchor"])
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("draft_vocab", [None, 40], ids=["full_vocab", "reduced_vocab"])
def test_training_forward_equals_inference(sfa, head, draft_vocab):
    model = tiny_model(
        sample_from_anchor=sfa, markov_head_type=head, draft_vocab_size=draft_vocab
    ).double()
    anchors = torch.tensor([[0, 3, 7, 11], [9, 2, 5, 6]])  # unsorted, overlapping blocks, p=0
    run_equivalence(model, anchors)
    nd = model.config.num_speculative_tokens
    valid = torch.ones_like(anchors, dtype=torch.bool)
    assert block_label_positions(anchors, valid, nd, 16)[1].all()  # every label inside T = 16


def test_training_forward_equals_inference_dflash():
    model = tiny_model(markov_rank=0, enable_confidence_head=False, sample_from_anchor=False)
    out = run_equivalence(model.double(), torch.tensor([[1, 6, 10]]))
    assert out.markov_input.shape[-1] == 0


@pytest.mark.parametrize("sfa", [True, False], ids=["anchor_first", "bonus_anchor"])
@pytest.mark.parametrize("head", ["vanilla", "rnn"])
def test_training_forward_equals_inference_packed(sfa, head):
    model = tiny_model(sample_from_anchor=sfa, markov_head_type=head, draft_vocab_size=40)
    model = model.double()
    # Two sequences, each packing documents of lengths (5, 11) and (7, 4, 5).
    doc_ids = torch.tensor([[0] * 5 + [1] * 11, [0] * 7 + [1] * 4 + [2] * 5])
    position_ids = torch.cat(
        [
            torch.cat([torch.arange(5), torch.arange(11)]),
            torch.cat([torch.arange(k) for k in (7, 4, 5)]),
        ]
    ).view(2, 16)
    anchors = torch.tensor([[0, 2, 5, 9], [1, 7, 8, 11]])
    run_equivalence(model, anchors, doc_ids, position_ids)
    # Labels that fall in the next document (or past the end) are out of range: a naive loop.
    nd = model.config.num_speculative_tokens
    valid = torch.tensor([[True, True, True, False], [True] * 4])
    label_pos, in_range = block_label_positions(anchors, valid, nd, 16, doc_ids)
    for i, a, j in itertools.product(range(2), range(4), range(nd)):
        p = int(anchors[i, a])
        pos = p + 1 + j
        assert int(label_pos[i, a, j]) == min(pos, 15)
        counts = bool(valid[i, a]) and pos < 16 and int(doc_ids[i, pos]) == int(doc_ids[i, p])
        assert bool(in_range[i, a, j]) == counts, (i, a, j)
    assert not in_range[0, 1].all() and in_range[0, 2].all()  # anchor 2 crosses into doc 1
    assert not in_range[0, 3].any()  # an invalid anchor counts nowhere
