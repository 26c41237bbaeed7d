"""The distillation loss against a naive float64 per-token reference, and chunk invariance."""

import math

import pytest
import torch

from common.config import DSparkConfig
from common.model import DSparkDraftModel
from common.vocab import build_vocab_map
from train.loop.anchors import sample_anchors, valid_anchor_mask
from train.loop.loss import block_targets, distill_loss, summarize

V, HT, T = 48, 16, 24


def setup(reduced: bool, sample_from_anchor: bool = True, seed: int = 0, markov_rank: int = 4):
    torch.manual_seed(seed)
    cfg = DSparkConfig(
        vocab_size=V,
        target_hidden_size=HT,
        target_num_hidden_layers=4,
        target_layer_ids=[0, 1],
        mask_token_id=V - 1,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        block_size=4,
        markov_rank=markov_rank,
        enable_confidence_head=markov_rank > 0,  # DFlash (rank 0): no Markov, no confidence
        draft_vocab_size=30 if reduced else None,
        sample_from_anchor=sample_from_anchor,
    )
    m = DSparkDraftModel(cfg).double()
    vm = build_vocab_map(torch.randint(0, 9, (V,)), 30) if reduced else None
    m.init_from_target(torch.randn(V, 16), torch.randn(V, 16), *((vm.d2t, vm.t2d) if vm else ()))
    for p in m.parameters():  # nonzero Markov/confidence weights so every term matters
        if p.requires_grad:
            p.data.normal_(0, 0.3)
    n = 2
    ids = torch.randint(0, V - 1, (n, T))
    loss_mask = torch.rand(n, T) > 0.2
    aux = torch.randn(n, T, 2 * HT, dtype=torch.float64)
    final = torch.randn(n, T, HT, dtype=torch.float64)
    head = torch.randn(V, HT, dtype=torch.float64)
    anchors, valid = sample_anchors(loss_mask, 5, 0, 0, ids)
    return m, ids, loss_mask, aux, final, head, anchors, valid


def run_loss(m, ids, loss_mask, aux, final, head, anchors, valid, chunk):
    fo = m.forward_train(aux, ids, anchors, valid)
    tg = block_targets(ids, loss_mask, anchors, valid, m.config.num_speculative_tokens, m.t2d)
    return distill_loss(m, fo, tg, final, head, tg.dens(), chunk_tokens=chunk), fo, tg


def naive_loss(m, fo, tg, final, head, ids):
    """Token-by-token float64 loop over (n, a, j), written from dspark.md."""
    nums = {"ce": 0.0, "l1": 0.0, "bce": 0.0}
    dens = {"ce": 0.0, "l1": 0.0}
    logits = m.block_logits(fo.hidden, fo.markov_input)  # [N, A, Nd, Vd]
    sel = m.draft_ids_in_target
    n, a, nd = tg.labels.shape
    for i in range(n):
        for k in range(a):
            for j in range(nd):
                if tg.mask[i, k, j] == 0:
                    continue
                w = math.exp(-j / 4)
                p_d = torch.softmax(logits[i, k, j], -1)
                z_t = head @ final[i, tg.label_pos[i, k, j] - 1]
                cap = m.config.target_logit_softcap  # Gemma: cap * tanh(z / cap), teacher only
                p_t = torch.softmax(cap * torch.tanh(z_t / cap) if cap else z_t, -1)
                l1 = (p_d - p_t[sel]).abs().sum() + (1 - p_t[sel].sum())
                nums["l1"] += w * l1
                dens["l1"] += w
                lab = int(tg.labels[i, k, j])
                if bool(m.t2d[lab]):
                    d = int((sel == lab).nonzero())
                    nums["ce"] += -w * torch.log(p_d[d])
                    dens["ce"] += w
                if m.confidence_head is None:  # DFlash: no confidence term
                    continue
                c = m.compute_confidence(fo.hidden[i, k, j][None], fo.markov_embed[i, k, j][None])
                y = 1 - l1.detach() / 2
                nums["bce"] += -w * (y * torch.log(c) + (1 - y) * torch.log(1 - c)).squeeze()
    return 0.1 * nums["ce"] / dens["ce"] + 0.9 * nums["l1"] / dens["l1"] + nums["bce"] / dens["l1"]


@pytest.mark.parametrize("reduced", [False, True])
@pytest.mark.parametrize("layout", [True, False])
def test_loss_matches_naive_reference(reduced, layout):
    m, ids, lm, aux, final, head, anchors, valid = setup(reduced, layout)
    (loss, _), fo, tg = run_loss(m, ids, lm, aux, final, head, anchors, valid, chunk=1024)
    ref = naive_loss(m, fo, tg, final, head, ids)
    assert float(loss) == pytest.approx(float(ref), rel=1e-9, abs=1e-9)


def test_chunking_changes_neither_loss_nor_gradients():
    m, ids, lm, aux, final, head, anchors, valid = setup(True)
    grads = []
    for chunk in (3, 100000):
        m.zero_grad()
        (loss, sums), _, _ = run_loss(m, ids, lm, aux, final, head, anchors, valid, chunk)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
        grads[-1]["loss"] = loss.detach()
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 5
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], rtol=1e-10, atol=1e-12), k


def test_teacher_runs_once_per_shared_position():
    """Overlapping blocks read the same label-1 positions: the teacher's hidden rows are the
    distinct ones, every row points at its own position's, and computing the teacher per row
    instead gives the same loss, gradients and metrics (3-row chunks: ranges cut mid-group)."""
    from train.loop.vocab_loss import kept_rows

    m, ids, lm, aux, final, head, anchors, valid = setup(True)
    fo = m.forward_train(aux, ids, anchors, valid)
    tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
    rows = kept_rows(m, fo, tg, final)
    n, t = ids.shape
    pos = (tg.label_pos - 1 + torch.arange(n)[:, None, None] * t).view(-1)[rows.idx]
    assert rows.idx.sort().values.equal(tg.mask.view(-1).nonzero().squeeze(1))
    assert rows.th.shape[0] == pos.unique().numel() < pos.numel()
    assert rows.th[rows.teacher_row].equal(final.reshape(n * t, -1)[pos])
    got = {}
    for share in (True, False):
        m.zero_grad()
        fo = m.forward_train(aux, ids, anchors, valid)
        loss, sums = distill_loss(
            m, fo, tg, final, head, tg.dens(), chunk_tokens=3, share_teacher=share
        )
        loss.backward()
        got[share] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        got[share].update(loss=loss.detach(), **sums)
    assert got[True].keys() == got[False].keys()
    for k in got[False]:
        assert torch.allclose(got[True][k], got[False][k], rtol=1e-10, atol=1e-12), k


def gradients(m, ids, lm, aux, final, head, anchors, valid, mode) -> dict:
    """Loss and parameter gradients through the float64 loop (`mode` "naive") or distill_loss
    chunked at 3 rows: vocab_grad `mode`, or "compiled" (the fused path through torch.compile).
    The naive loop backprops BCE into the backbone too, so the confidence is not detached."""
    m.zero_grad()
    fo = m.forward_train(aux, ids, anchors, valid)
    tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
    if mode == "naive":
        loss = naive_loss(m, fo, tg, final, head, ids)
    else:
        compiled = mode == "compiled"
        loss, _ = distill_loss(
            m,
            fo,
            tg,
            final,
            head,
            tg.dens(),
            chunk_tokens=3,
            vocab_grad="fused" if compiled else mode,
            confidence_detach=False,
            compiled=compiled,
        )
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return {**grads, "loss": loss.detach()}


def assert_same_gradients(got: dict, ref: dict) -> None:
    assert got.keys() == ref.keys()
    for k, r in ref.items():
        assert torch.allclose(got[k], r, rtol=1e-9, atol=1e-11), k
        assert k == "loss" or r.abs().max() > 0, k  # every compared gradient is informative


@pytest.mark.parametrize("softcap", [None, 0.5], ids=["no-cap", "softcap"])
@pytest.mark.parametrize("reduced", [False, True])
@pytest.mark.parametrize("mode", ["fused", "checkpoint"])
@pytest.mark.parametrize("rank", [4, 0], ids=["dspark", "dflash"])
def test_vocab_grad_modes_match_naive_reference_gradients(reduced, mode, rank, softcap):
    """Both gradient paths of the vocab-sized part against autograd through the float64
    per-token loop (and the fused path's closed form against autograd, chunked at 3 rows), with
    and without a soft-capped teacher (a cap small enough to change these logits)."""
    data = setup(reduced, markov_rank=rank)
    data[0].config.target_logit_softcap = softcap
    got = gradients(*data, mode)
    assert ("markov_head.markov_w2.weight" in got) == (rank > 0)
    assert "fc.weight" in got
    assert_same_gradients(got, gradients(*data, "naive"))


def test_compiled_loss_chunks_match_the_naive_reference():
    """`trainer.compile_loss`: the fused path's chunks through torch.compile (Inductor, one
    graph each: fullgraph) give the float64 loop's loss and gradients, on the configuration
    that exercises every branch (reduced vocab, Markov head, soft-capped teacher; 3-row chunks,
    so a shorter last chunk too), and the eager path's metrics, greedy agreement included."""
    data = setup(True)
    m, ids, lm, aux, final, head, anchors, valid = data
    m.config.target_logit_softcap = 0.5
    assert_same_gradients(gradients(*data, "compiled"), gradients(*data, "naive"))
    sums = {}
    with torch.no_grad():  # evaluation: the greedy branch, compiled and eager
        fo = m.forward_train(aux, ids, anchors, valid)
        tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
        for compiled in (False, True):
            _, sums[compiled] = distill_loss(
                m, fo, tg, final, head, tg.dens(), chunk_tokens=3, compiled=compiled
            )
    assert sums[True].keys() == sums[False].keys() and any("greedy" in k for k in sums[True])
    for k in sums[False]:
        assert torch.allclose(sums[True][k], sums[False][k], rtol=1e-9, atol=1e-12), k


def test_compiled_loss_chunk_compiles_twice_whatever_the_row_counts():
    """The kept rows change every step, so the last chunk's length does, and every chunk's count
    of distinct teacher positions: the compiled chunk must not recompile per step (the first
    other lengths make both counts dynamic)."""
    from torch._dynamo.testing import CompileCounter

    from train.loop.vocab_loss import compiled_fused_chunk

    torch._dynamo.reset()  # forget row counts seen as dynamic by earlier tests' compiles
    counter = CompileCounter()
    chunk = compiled_fused_chunk(counter)
    torch.manual_seed(0)
    w, wt = torch.randn(30, 12), torch.randn(48, 8)
    sel = torch.randperm(48)[:30].sort().values
    for rows, positions in ((16, 9), (5, 4), (11, 9), (16, 7), (3, 3), (9, 5)):
        x, th = torch.randn(rows, 12), torch.randn(positions, 8)
        at = torch.randint(0, positions, (rows,)).sort().values
        labels, cc, cl = torch.randint(-1, 30, (rows,)), torch.rand(rows), torch.rand(rows)
        chunk(x, w, th, at, wt, sel, None, labels, cc, cl, False)
    assert counter.frame_count == 2


def test_fused_gradient_differs_when_a_term_is_dropped():
    """Negative control: the comparison above would catch a missing L1 gradient."""
    m, ids, lm, aux, final, head, anchors, valid = setup(True)
    out = []
    for w in ((0.1, 0.9, 1.0), (0.1, 0.0, 1.0)):
        m.zero_grad()
        fo = m.forward_train(aux, ids, anchors, valid)
        tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
        loss, _ = distill_loss(m, fo, tg, final, head, tg.dens(), weights=w, vocab_grad="fused")
        loss.backward()
        out.append(m.markov_head.markov_w2.weight.grad.clone())
    assert not torch.allclose(out[0], out[1], rtol=1e-3, atol=1e-6)


def test_confidence_detach_blocks_backbone_gradient_from_bce():
    m, ids, lm, aux, final, head, anchors, valid = setup(False)
    fo = m.forward_train(aux, ids, anchors, valid)
    tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
    dens = tg.dens()
    grads = {}
    for detach in (True, False):
        m.zero_grad()
        fo = m.forward_train(aux, ids, anchors, valid)
        loss, _ = distill_loss(
            m, fo, tg, final, head, dens, weights=(0, 0, 1.0), confidence_detach=detach
        )
        loss.backward()
        grads[detach] = m.fc.weight.grad
    assert grads[True] is None or grads[True].abs().max() == 0
    assert grads[False].abs().max() > 0


def test_summary_tau_and_acceptance_are_pooled():
    m, ids, lm, aux, final, head, anchors, valid = setup(False)
    (_, sums), fo, tg = run_loss(m, ids, lm, aux, final, head, anchors, valid, 1024)
    s = summarize(sums)
    alpha = s["acceptance_per_pos"]
    assert len(alpha) == m.config.num_speculative_tokens
    assert all(0 <= x <= 1 for x in alpha)
    assert s["analytic_tau"] == pytest.approx(
        1 + sum(math.prod(alpha[: k + 1]) for k in range(len(alpha)))
    )


def test_anchors_are_valid_distinct_and_keyed():
    lm = torch.rand(3, 50) > 0.3
    ids = torch.randint(0, 100, (3, 50))
    a1, v1 = sample_anchors(lm, 10, 1, 5, ids)
    a2, v2 = sample_anchors(lm, 10, 1, 5, ids)
    a3, _ = sample_anchors(lm, 10, 1, 6, ids)
    assert torch.equal(a1, a2) and torch.equal(v1, v2) and not torch.equal(a1, a3)
    # A row's anchors do not depend on the other rows of its batch (rank/micro independence).
    a_row, v_row = sample_anchors(lm[1:2], 10, 1, 5, ids[1:2])
    k = int(v_row.sum())
    assert torch.equal(a_row[0, :k], a1[1][v1[1]])
    ok = valid_anchor_mask(lm)
    for r in range(3):
        got = a1[r][v1[r]]
        assert ok[r, got].all() and len(set(got.tolist())) == len(got)
        assert int(v1[r].sum()) == min(10, int(ok[r].sum()))


def naive_greedy_agreement(m, fo, tg, final, head) -> list[float]:
    """Per position: the share of supervised rows where the draft's argmax (over its vocab,
    mapped to a target id) is the teacher's argmax over the FULL target vocab; float64 loop."""
    logits = m.block_logits(fo.hidden, fo.markov_input)
    sel = m.draft_ids_in_target
    n, a, nd = tg.labels.shape
    hits, rows = [0] * nd, [0] * nd
    for i in range(n):
        for k in range(a):
            for j in range(nd):
                if tg.mask[i, k, j] == 0:
                    continue
                draft_token = int(sel[int(logits[i, k, j].argmax())])
                teacher_token = int((head @ final[i, tg.label_pos[i, k, j] - 1]).argmax())
                hits[j] += draft_token == teacher_token
                rows[j] += 1
    return [h / max(r, 1) for h, r in zip(hits, rows, strict=True)]


@pytest.mark.parametrize("reduced", [False, True])
@pytest.mark.parametrize("mode", ["fused", "checkpoint"])
def test_greedy_agreement_matches_naive_argmax(reduced, mode):
    """The T=0 counterpart of the analytic acceptance, in evaluation: both gradient modes count
    the draft's argmax against the teacher's full-vocab argmax, and a teacher argmax outside a
    reduced draft vocabulary is never a match."""
    m, ids, lm, aux, final, head, anchors, valid = setup(reduced, seed=3)
    fo = m.forward_train(aux, ids, anchors, valid)
    tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
    # A random draft seldom picks a random teacher's argmax: make the teacher's argmax the
    # draft's most frequent pick for about half the contexts (those on one side of a plane), so
    # matches and misses both occur.
    picks = m.draft_ids_in_target[m.block_logits(fo.hidden, fo.markov_input).argmax(-1)]
    favourite = int(picks[tg.mask > 0].mode().values)
    head = head.clone()
    head[favourite] = 20 * torch.randn(HT, dtype=head.dtype)
    _, with_grad = distill_loss(m, fo, tg, final, head, tg.dens(), chunk_tokens=7, vocab_grad=mode)
    assert "greedy_tau" not in summarize(with_grad)  # the training step does not pay for it
    with torch.no_grad():
        _, sums = distill_loss(m, fo, tg, final, head, tg.dens(), chunk_tokens=7, vocab_grad=mode)
    s = summarize(sums)
    ref = naive_greedy_agreement(m, fo, tg, final, head)
    assert s["greedy_acceptance_per_pos"] == pytest.approx(ref, abs=1e-12)
    assert s["greedy_tau"] == pytest.approx(
        1 + sum(math.prod(ref[: k + 1]) for k in range(len(ref)))
    )
    assert 0 < sum(ref) < len(ref)  # neither all nor no matches: a wrong count would show


def test_greedy_agreement_never_matches_a_teacher_argmax_outside_the_draft_vocab():
    from train.loop.vocab_loss import _teacher_probs, greedy_agreement

    torch.manual_seed(0)
    head = torch.randn(10, 4, dtype=torch.float64)
    h = torch.randn(50, 4, dtype=torch.float64)
    sel = torch.tensor([0, 2, 4, 6, 8])  # the even target ids form the draft vocab
    p_sel, _, top = _teacher_probs(h, head, sel, greedy=True)
    full_argmax = (h @ head.T).argmax(-1)
    inside = full_argmax % 2 == 0
    assert 0 < int(inside.sum()) < 50
    assert torch.equal(top[inside], full_argmax[inside] // 2)
    assert bool((top[~inside] == -1).all())
    # A draft sure of the best draft-vocab token agrees exactly where the teacher's argmax is in.
    assert torch.equal(greedy_agreement(p_sel, top), inside)


def test_shared_teacher_counts_are_rows_and_their_distinct_positions():
    """The shared-teacher counts: rows and distinct positions against a brute-force count."""
    from train.loop.vocab_loss import shared_teacher_counts

    m, ids, lm, aux, final, head, anchors, valid = setup(True)
    tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
    n, a, nd = tg.labels.shape
    seen = {
        (i, int(tg.label_pos[i, k, j]) - 1)
        for i in range(n)
        for k in range(a)
        for j in range(nd)
        if tg.mask[i, k, j] > 0
    }
    assert shared_teacher_counts(tg, T) == (int(tg.mask.sum()), len(seen))
    assert len(seen) < int(tg.mask.sum())


@pytest.mark.parametrize("share", [True, False])
def test_rows_planned_ahead_give_the_same_loss_without_planning_in_the_forward(share, monkeypatch):
    """The trainer plans the loss's rows and chunks while the previous step runs: the loss then
    reads that plan (no host sync in its forward) and gives the loss, gradients and metrics it
    computes when it plans them itself; a plan made for other settings is not used."""
    from train.loop import vocab_loss

    m, ids, lm, aux, final, head, anchors, valid = setup(True)
    got = []
    for ahead in (False, True):
        m.zero_grad()
        fo = m.forward_train(aux, ids, anchors, valid)
        tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
        with monkeypatch.context() as mp:
            if ahead:
                tg.plan = vocab_loss.plan_rows(tg, T, share, 3)

                def refuse(*_a, **_k):
                    raise AssertionError("the loss planned rows it was handed")

                mp.setattr(vocab_loss, "plan_rows", refuse)
                mp.setattr(vocab_loss, "chunk_spans", refuse)
            loss, sums = distill_loss(
                m, fo, tg, final, head, tg.dens(), chunk_tokens=3, share_teacher=share
            )
        loss.backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        got.append({**grads, **sums, "loss": loss.detach()})
    assert got[0].keys() == got[1].keys()
    for k in got[0]:
        assert torch.equal(got[0][k], got[1][k]), k
    # A plan for another chunk size or sharing is replanned, not misread.
    fo = m.forward_train(aux, ids, anchors, valid)
    tg = block_targets(ids, lm, anchors, valid, m.config.num_speculative_tokens, m.t2d)
    tg.plan = vocab_loss.plan_rows(tg, T, not share, 5)
    loss, _ = distill_loss(m, fo, tg, final, head, tg.dens(), chunk_tokens=3, share_teacher=share)
    assert torch.equal(loss.detach(), got[0]["loss"])
