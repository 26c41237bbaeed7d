"""Block attention: a block anchored at p sees context positions < p (of its own document) and its
own block only. Checked through `forward_train` inputs, not by reading the mask back."""

from __future__ import annotations

import pytest
import torch

from common.model import inference_block_mask, training_block_mask
from tests.conftest import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")

T = 20
ANCHORS = torch.tensor([[3, 9, 14]])  # blocks of B=4: [3, 7), [9, 13), [14, 18)


def block_logits(model, ctx, ids, doc_ids=None, position_ids=None):
    """[A, Nd, Vd] logits of every block of the single sequence."""
    valid = torch.ones_like(ANCHORS, dtype=torch.bool)
    out = model.forward_train(ctx, ids, ANCHORS, valid, position_ids, doc_ids)
    return model.block_logits(out.hidden, out.markov_input)[0]


@pytest.fixture(scope="module", params=[True, False], ids=["anchor_first", "bonus_anchor"])
def setup(request):
    model = tiny_model(sample_from_anchor=request.param, draft_vocab_size=40).double()
    gen = torch.Generator().manual_seed(1)
    ctx = torch.randn(1, T, model.config.fc_input_size, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, 90, (1, T), generator=gen)
    return model, ctx, ids, block_logits(model, ctx, ids)


def changed(base, new):
    """Per block: did any logit move?"""
    return [bool((new[a] - base[a]).abs().max() > 1e-9) for a in range(base.shape[0])]


@pytest.mark.parametrize(
    "pos, expect",
    [
        (2, [True, True, True]),  # before every anchor
        (3, [False, True, True]),  # block 0's anchor position itself: after its context
        (8, [False, True, True]),  # after block 0's anchor, before block 1's
        (13, [False, False, True]),
        (19, [False, False, False]),  # after every anchor
    ],
)
def test_context_state_visible_only_before_the_anchor(setup, pos, expect):
    model, ctx, ids, base = setup
    ctx2 = ctx.clone()
    ctx2[0, pos] += 1.0
    assert changed(base, block_logits(model, ctx2, ids)) == expect


def test_anchor_token_changes_only_its_block(setup):
    model, ctx, ids, base = setup
    ids2 = ids.clone()
    ids2[0, 9] = (ids[0, 9] + 1) % 90  # the anchor token of block 1 = the token inside block 1
    assert changed(base, block_logits(model, ctx, ids2)) == [False, True, False]


def test_token_after_the_anchor_changes_only_markov_slots(setup):
    """x_{p+2} is a label of block 0 (slot predicting it) and the teacher-forced previous token
    of the next slot: only block 0's later slots move, and the backbone hidden does not."""
    model, ctx, ids, base = setup
    ids2 = ids.clone()
    ids2[0, 5] = (ids[0, 5] + 1) % 90  # p=3: x_5 is prev of draft j=2
    new = block_logits(model, ctx, ids2)
    assert changed(base, new) == [True, False, False]
    moved = [(new[0, j] - base[0, j]).abs().max() > 1e-9 for j in range(base.shape[1])]
    assert moved == [j == 2 for j in range(base.shape[1])]


def test_token_before_the_anchor_only_reaches_blocks_through_ctx_states(setup):
    model, ctx, ids, base = setup
    ids2 = ids.clone()
    ids2[0, 1] = (ids[0, 1] + 1) % 90  # not an anchor nor a teacher-forced prev
    assert changed(base, block_logits(model, ctx, ids2)) == [False, False, False]


def test_packed_documents_hide_other_documents():
    model = tiny_model().double()
    gen = torch.Generator().manual_seed(2)
    ctx = torch.randn(1, T, model.config.fc_input_size, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, 90, (1, T), generator=gen)
    doc_ids = torch.tensor([[0] * 8 + [1] * 12])
    pos = torch.cat([torch.arange(8), torch.arange(12)]).view(1, T)
    base = block_logits(model, ctx, ids, doc_ids, pos)
    ctx2 = ctx.clone()
    ctx2[0, 2] += 1.0  # doc 0, before every anchor: invisible to blocks of doc 1
    assert changed(base, block_logits(model, ctx2, ids, doc_ids, pos)) == [True, False, False]
    ctx3 = ctx.clone()
    ctx3[0, 8] += 1.0  # first position of doc 1
    assert changed(base, block_logits(model, ctx3, ids, doc_ids, pos)) == [False, True, True]


def test_mask_shapes_and_rule():
    m = training_block_mask(torch.tensor([[2, 5]]), seq_len=8, block_size=3)
    assert m.shape == (1, 6, 8 + 6)
    assert m[0, :3, :8].tolist() == [[True, True] + [False] * 6] * 3
    assert m[0, 3:, :8].tolist() == [[True] * 5 + [False] * 3] * 3
    assert m[0, :3, 8:11].all() and not m[0, :3, 11:].any() and not m[0, 3:, 8:11].any()
    im = inference_block_mask(torch.tensor([0, 3]), ctx_capacity=4, block_size=2)
    assert im.shape == (2, 2, 6)
    assert im[0].tolist() == [[False] * 4 + [True] * 2] * 2
    assert im[1].tolist() == [[True] * 3 + [False] + [True] * 2] * 2


@pytest.mark.parametrize("packed", [False, True])
def test_flex_block_mask_gives_the_dense_mask_result(packed):
    """`train_attention="flex"` (a BlockMask) against the dense boolean mask, float64, with
    packed documents and an invalid (padding) anchor; shifting the anchors in the flex mask alone
    must change the result (negative control). Forward only: CPU flex attention has no backward
    (the kernel's gradient is flex attention's own, exercised by the GPU benchmark)."""
    model = tiny_model(draft_vocab_size=40).double()
    gen = torch.Generator().manual_seed(3)
    n, t = 2, 24
    ctx = torch.randn(n, t, model.config.fc_input_size, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, 90, (n, t), generator=gen)
    anchors = torch.tensor([[2, 8, 15], [0, 5, 11]])
    valid = torch.tensor([[True, True, True], [False, True, True]])
    doc_ids = pos = None
    if packed:
        doc_ids = torch.tensor([[0] * 10 + [1] * 14, [0] * 7 + [1] * 17])
        starts = torch.tensor([[0] * 10 + [10] * 14, [0] * 7 + [7] * 17])
        pos = torch.arange(t).expand(n, t) - starts
    outs = {}
    for backend, anc in (("sdpa", anchors), ("flex", anchors), ("shifted", anchors + 1)):
        model.train_attention = "sdpa" if backend == "sdpa" else "flex"
        with torch.no_grad():
            outs[backend] = model.forward_train(ctx, ids, anc, valid, pos, doc_ids).hidden
    model.train_attention = "sdpa"
    assert torch.allclose(outs["flex"], outs["sdpa"], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(outs["shifted"], outs["sdpa"], rtol=1e-6, atol=1e-8)


def test_document_causal_block_mask_matches_the_dense_mask():
    """The target's packed-row mask as a BlockMask (flex-attention targets) against the dense
    mask through attention itself, with a padding tail; a plain causal mask must differ."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from train.data import document_causal_mask
    from train.loop.blocks import document_causal_block_mask

    gen = torch.Generator().manual_seed(0)
    doc_ids = torch.tensor([[0] * 50 + [1] * 100 + [2] * 90 + [-1] * 16, [0] * 200 + [1] * 56])
    q, k, v = (torch.randn(2, 2, 256, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=document_causal_mask(doc_ids)
    )
    with torch.no_grad():
        flex = flex_attention(q, k, v, block_mask=document_causal_block_mask(doc_ids))
        causal = create_block_mask(lambda b, h, i, j: j <= i, 2, None, 256, 256, device="cpu")
        plain = flex_attention(q, k, v, block_mask=causal)
    assert torch.allclose(flex, dense, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(plain, dense, rtol=1e-3, atol=1e-6)
