"""Markov walk (dense and top-k) on tiny real DSparkDraftModels, against naive references."""

import pytest
import torch

from common.config import MARKOV_HEAD_TYPES
from common.sampling.draft_probs import DraftProbs
from common.sampling.gumbel import Stream, gumbel_sample
from common.sampling.markov_walk import markov_walk
from tests.dist.tiny import single_thread, tiny_model  # noqa: F401

HEADS = MARKOV_HEAD_TYPES


def _inputs(model, R, seed=0, temp=0.8):
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    N = cfg.num_speculative_tokens
    hidden = torch.randn(R, N, cfg.hidden_size, generator=g)
    base = model.compute_draft_logits(hidden.flatten(0, 1)).view(R, N, -1)
    anchor = torch.randint(cfg.vocab_size, (R,), generator=g)
    temps = torch.full((R,), float(temp)) if not isinstance(temp, torch.Tensor) else temp
    seeds = torch.randint(1 << 40, (R,), generator=g)
    pos = torch.randint(1, 500, (R,), generator=g)
    return base, hidden, anchor, temps, seeds, pos


class _Spy:
    """Wraps a model, records the prev ids fed to markov_step."""

    def __init__(self, model):
        self.m, self.prev = model, []
        self.config = model.config

    def markov_step(self, prev, hidden, state):
        self.prev.append(prev.clone())
        return self.m.markov_step(prev, hidden, state)

    def __getattr__(self, name):
        return getattr(self.m, name)


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("draft_vocab", [None, 6])
def test_dense_walk_matches_naive_reference(head, draft_vocab):
    """Step by step: logits = U_k + bias(prev) with prev the anchor then the previous *target*
    id; draw = gumbel_sample keyed (seed, P_0 + k - 1) on the DRAFT stream, noise keyed by target
    column; confidences = compute_confidence(h, markov_embed(prev))."""
    model = tiny_model(seed=3, vocab_size=11, draft_vocab_size=draft_vocab, markov_head_type=head)
    R = 5
    base, hidden, anchor, temps, seeds, pos = _inputs(
        model, R, temp=torch.tensor([0, 0.5, 1, 2, 1])
    )
    spy = _Spy(model)
    out = markov_walk(spy, base, hidden, anchor, temps, seeds, pos)
    Vd = base.shape[-1]
    tcols = model.map_draft_to_target(torch.arange(Vd))
    prev, state, embeds = anchor, None, []
    for k in range(base.shape[1]):
        assert torch.equal(spy.prev[k], prev)
        bias, e, state = model.markov_step(prev, hidden[:, k], state)
        logits = base[:, k] + bias
        d = gumbel_sample(logits, temps, seeds, pos + k - 1, stream=Stream.DRAFT, cols=tcols)
        prev = model.map_draft_to_target(d)
        assert torch.equal(out.draft_ids[:, k], prev)
        embeds.append(model.markov_embed(spy.prev[k]))
        p = torch.softmax(logits / temps.clamp(min=1e-9).unsqueeze(1), -1)
        p[0] = torch.nn.functional.one_hot(logits[0].argmax(), Vd).float()  # greedy row
        torch.testing.assert_close(out.draft_probs.probs[:, k], p)
        torch.testing.assert_close(out.draft_probs.token_probs[:, k], p.gather(1, d[:, None])[:, 0])
    conf = model.compute_confidence(hidden.flatten(0, 1), torch.stack(embeds, 1).flatten(0, 1))
    assert torch.equal(out.confidence, conf.view(R, -1))
    # Drafts are target ids inside the draft vocab's image.
    assert torch.isin(out.draft_ids, tcols).all()


def test_vanilla_step_is_vllm_markov_bias_of_embed():
    model = tiny_model(seed=1, vocab_size=9)
    prev, h = torch.tensor([0, 4, 8]), torch.randn(3, model.config.hidden_size)
    bias, e, _ = model.markov_step(prev, h, None)
    assert torch.equal(bias, model.markov_bias(model.markov_embed(prev)))


def test_greedy_walk_is_sequential_argmax_and_dflash_has_no_bias():
    model = tiny_model(seed=2, vocab_size=10, markov_rank=0, confidence=False)
    base, hidden, anchor, _, seeds, pos = _inputs(model, 4)
    out = markov_walk(model, base, hidden, anchor, torch.zeros(4), seeds, pos)
    assert torch.equal(out.draft_ids, base.argmax(-1))
    assert out.confidence is None
    fast = markov_walk(model, base, hidden, anchor, torch.zeros(4), seeds, pos, all_greedy=True)
    assert torch.equal(fast.draft_ids, out.draft_ids)
    assert torch.equal(fast.draft_probs.probs, out.draft_probs.probs)


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("draft_vocab", [None, 7])
@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_topk_with_k_equal_vocab_reproduces_dense(head, draft_vocab, temp):
    model = tiny_model(seed=4, vocab_size=12, draft_vocab_size=draft_vocab, markov_head_type=head)
    base, hidden, anchor, temps, seeds, pos = _inputs(model, 6, temp=temp)
    Vd = base.shape[-1]
    dense = markov_walk(model, base, hidden, anchor, temps, seeds, pos, probs="target")
    topk = markov_walk(model, base, hidden, anchor, temps, seeds, pos, topk=Vd, probs="target")
    assert torch.equal(topk.draft_ids, dense.draft_ids)
    # Gathered W2 rows (bmm) vs the dense Linear: equal up to float rounding.
    torch.testing.assert_close(topk.draft_probs.probs, dense.draft_probs.probs)
    assert torch.equal(topk.confidence, dense.confidence)


def test_topk_dense_fallback_is_bitwise():
    """A model without markov_head internals goes through markov_step + gather: bit-identical."""

    class NoInternals(_Spy):
        def __getattr__(self, name):
            if name == "markov_head":
                raise AttributeError(name)
            return getattr(self.m, name)

    model = tiny_model(seed=5, vocab_size=12, draft_vocab_size=9, markov_head_type="rnn")
    base, hidden, anchor, temps, seeds, pos = _inputs(model, 6)
    wrapped = NoInternals(model)
    dense = markov_walk(model, base, hidden, anchor, temps, seeds, pos, probs="target")
    topk = markov_walk(wrapped, base, hidden, anchor, temps, seeds, pos, topk=9, probs="target")
    assert len(wrapped.prev) == base.shape[1]  # really took the fallback
    assert torch.equal(topk.draft_ids, dense.draft_ids)
    assert torch.equal(topk.draft_probs.probs, dense.draft_probs.probs)


@pytest.mark.parametrize("head", HEADS)
def test_topk_restricts_to_base_topk_candidates(head):
    model = tiny_model(seed=6, vocab_size=20, draft_vocab_size=15, markov_head_type=head)
    R, k = 64, 3
    base, hidden, anchor, temps, seeds, pos = _inputs(model, R, temp=1.5)
    out = markov_walk(model, base, hidden, anchor, temps, seeds, pos, topk=k)
    cand_t = model.map_draft_to_target(base.topk(k, -1).indices)  # [R, N, k]
    assert (out.draft_ids.unsqueeze(-1) == cand_t).any(-1).all()
    rows = out.draft_probs.to_target()  # [R, N, V]
    support = torch.zeros_like(rows, dtype=torch.bool).scatter_(2, cand_t, True)
    assert (rows[~support] == 0).all()
    torch.testing.assert_close(rows.sum(-1), torch.ones(R, base.shape[1]))
    assert out.draft_probs.probs.shape == (R, base.shape[1], k)  # compact: k columns, not V


def test_probs_modes_and_scatter_into_target_space():
    model = tiny_model(seed=7, vocab_size=13, draft_vocab_size=5)
    base, hidden, anchor, temps, seeds, pos = _inputs(model, 4)
    compact = markov_walk(model, base, hidden, anchor, temps, seeds, pos)
    target = markov_walk(model, base, hidden, anchor, temps, seeds, pos, probs="target")
    none = markov_walk(model, base, hidden, anchor, temps, seeds, pos, probs="none")
    assert none.draft_probs is None and torch.equal(none.draft_ids, compact.draft_ids)
    assert compact.draft_probs.probs.shape == (4, base.shape[1], 5)
    dense = compact.draft_probs.to_target()
    assert torch.equal(dense, target.draft_probs.probs)
    off_vocab = ~model.t2d
    assert (dense[..., off_vocab] == 0).all()
    tok = dense.gather(2, compact.draft_ids.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(tok, compact.draft_probs.token_probs)
    again = DraftProbs.from_target(dense, compact.draft_ids)
    assert torch.equal(again.row(1), dense[:, 1])


def test_walk_rows_are_independent_of_batch_composition():
    model = tiny_model(seed=8, vocab_size=10, markov_head_type="rnn")
    base, hidden, anchor, temps, seeds, pos = _inputs(model, 6)
    full = markov_walk(model, base, hidden, anchor, temps, seeds, pos)
    for i in range(6):
        sl = slice(i, i + 1)
        one = markov_walk(model, base[sl], hidden[sl], anchor[sl], temps[sl], seeds[sl], pos[sl])
        assert torch.equal(one.draft_ids, full.draft_ids[sl])
