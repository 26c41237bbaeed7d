"""train/loop/walk_anchors.py: the anchors greedy rounds visit, each piece against a naive reference
(one anchor at a time, one position at a time), and trainer.anchor_sampling=walk end to end."""

import json

import pytest
import torch

from tests.tiny import tiny_model
from train.loop.anchors import valid_anchor_mask
from train.loop.walk_anchors import accepted_counts, walk_anchors, walk_visits


def packed_batch(gen: torch.Generator, n=2, t=40, vocab=96):
    """Rows of three documents each, a prompt then an answer per document (loss on the answer)."""
    ids = torch.randint(0, vocab - 1, (n, t), generator=gen)
    doc = torch.zeros(n, t, dtype=torch.long)
    lm = torch.zeros(n, t, dtype=torch.long)
    pos = torch.zeros(n, t, dtype=torch.long)
    for r in range(n):
        cuts = sorted(torch.randperm(t - 2, generator=gen)[:2].add(1).tolist())
        bounds = [0, *cuts, t]
        for d, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            doc[r, a:b] = d
            pos[r, a:b] = torch.arange(b - a)
            prompt = int(torch.randint(1, max(2, b - a), (1,), generator=gen))
            lm[r, a + prompt : b] = 1
    return {"input_ids": ids, "loss_mask": lm, "doc_ids": doc, "position_ids": pos}


def naive_visits(counts, lm, doc):
    """One position at a time: an answer starts where the loss mask turns on (or a document
    does); the first round is anchored at its first token, each next one past the last round's
    accepted drafts; an anchor needs the next token in the same answer."""
    n, t = lm.shape
    out = torch.zeros(n, t, dtype=torch.bool)
    for r in range(n):
        nxt = None
        for i in range(t):
            starts = lm[r, i] and (i == 0 or not lm[r, i - 1] or doc[r, i] != doc[r, i - 1])
            if starts:
                nxt = i
            can = i + 1 < t and lm[r, i] and lm[r, i + 1] and doc[r, i + 1] == doc[r, i]
            if i == nxt and can:
                out[r, i] = True
                nxt = i + int(counts[r, i]) + 1
    return out


@pytest.mark.parametrize("seed", range(5))
def test_walk_visits_matches_a_position_by_position_walk(seed):
    gen = torch.Generator().manual_seed(seed)
    b = packed_batch(gen, n=3, t=60)
    ok = valid_anchor_mask(b["loss_mask"], b["doc_ids"])
    counts = torch.where(ok, torch.randint(0, 5, ok.shape, generator=gen), -1)
    got = walk_visits(counts, b["loss_mask"], b["doc_ids"])
    want = naive_visits(counts, b["loss_mask"], b["doc_ids"])
    assert torch.equal(got, want)
    assert (got <= ok).all() and 0 < got.sum() < ok.sum()
    # a draft that accepts nothing visits every anchor
    zero = torch.where(ok, 0, -1)
    assert torch.equal(walk_visits(zero, b["loss_mask"], b["doc_ids"]), ok)


def naive_counts(draft, aux, b, teacher_top):
    """Anchor by anchor: one block's unchunked logits, its greedy ids in target space against the
    target's argmax at each slot's label, counted while the labels stay in the answer."""
    n, t = b["input_ids"].shape
    ok = valid_anchor_mask(b["loss_mask"], b["doc_ids"])
    out = torch.full((n, t), -1)
    nd = draft.config.num_speculative_tokens
    for r in range(n):
        for p in ok[r].nonzero().flatten().tolist():
            row = {k: v[r : r + 1] for k, v in b.items()}
            fo = draft.forward_train(
                aux[r : r + 1],
                row["input_ids"],
                torch.tensor([[p]]),
                torch.tensor([[True]]),
                position_ids=row["position_ids"],
                doc_ids=row["doc_ids"],
            )
            guess = draft.map_draft_to_target(
                draft.block_logits(fo.hidden, fo.markov_input)[0, 0].argmax(-1)
            )
            k = 0
            while k < nd:
                q = p + 1 + k
                inside = q < t and b["loss_mask"][r, q] and b["doc_ids"][r, q] == b["doc_ids"][r, p]
                if not (inside and guess[k] == teacher_top[r, q - 1]):
                    break
                k += 1
            out[r, p] = k
    return out


DFLASH = dict(markov_rank=0, enable_confidence_head=False, confidence_head_with_markov=False)


# full and reduced draft vocabulary, and a DFlash draft (no Markov head)
@pytest.mark.parametrize("overrides", [{}, {"draft_vocab_size": 48}, DFLASH])
@torch.no_grad()
def test_accepted_counts_match_anchor_by_anchor(overrides):
    gen = torch.Generator().manual_seed(1)
    draft = tiny_model(seed=2, **overrides)
    b = packed_batch(gen)
    n, t = b["input_ids"].shape
    aux = torch.randn(n, t, draft.config.fc_input_size, generator=gen)
    # The target's argmax at each position: the draft's own guess for that label from a random
    # slot of some block, so rounds accept partly (a random target would almost never agree).
    nd = draft.config.num_speculative_tokens
    anchors = torch.arange(t).expand(n, t).contiguous()
    fo = draft.forward_train(
        aux,
        b["input_ids"],
        anchors,
        torch.ones(n, t, dtype=torch.bool),
        position_ids=b["position_ids"],
        doc_ids=b["doc_ids"],
    )
    guess = draft.map_draft_to_target(draft.block_logits(fo.hidden, fo.markov_input).argmax(-1))
    k = torch.randint(0, nd, (n, t), generator=gen)
    src = (torch.arange(t) - k).clamp(min=0)  # label q = src + 1 + k predicted at q - 1
    top = guess[torch.arange(n).unsqueeze(1), src, k]
    top = torch.where(torch.rand(n, t, generator=gen) < 0.15, 94, top)  # some misses anyway
    want = naive_counts(draft, aux, b, top)
    got = accepted_counts(draft, aux, b, top, chunk_anchors=5)  # chunks, the last one padded
    assert torch.equal(got, want)
    assert (want > 0).any() and (want == 0).any()


@torch.no_grad()
def test_walk_anchors_draws_only_visited_anchors_in_a_fixed_shape():
    gen = torch.Generator().manual_seed(3)
    draft = tiny_model(seed=4)
    b = packed_batch(gen, n=3, t=50)
    n, t = b["input_ids"].shape
    aux = torch.randn(n, t, draft.config.fc_input_size, generator=gen)
    final = torch.randn(n, t, 16, generator=gen)
    head = torch.randn(draft.config.vocab_size, 16, generator=gen)
    anchors, valid, visited = walk_anchors(draft, aux, final, head, b, 7, seed=0, step=3)
    assert anchors.shape == valid.shape == (n, 7)
    rows = torch.arange(n).unsqueeze(1).expand_as(anchors)
    assert visited[rows[valid], anchors[valid]].all()
    assert (valid.sum(1) == visited.sum(1).clamp(max=7)).all()
    again = walk_anchors(draft, aux, final, head, b, 7, seed=0, step=3)
    assert torch.equal(anchors, again[0])  # keyed by (seed, step, row): a resume draws the same


def test_distill_with_walk_sampling_logs_the_visited_share(target, tmp_path):
    from train.distill import main as distill

    out = tmp_path / "run"
    overrides = [
        "+experiment=tiny",
        f"target.path={target}",
        "target.build_tiny=false",
        f"output_dir={out}",
        "trainer.max_steps=3",
        "trainer.eval_every=0",
        "trainer.progress=false",
        "trainer.threads=1",
        "trainer.anchor_sampling=walk",
    ]
    assert distill(overrides) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    shares = [r["walk_visited_share"] for r in rows if r["split"] == "train"]
    assert len(shares) == 3 and all(0 < s <= 1 for s in shares)


def test_walk_sampling_refuses_fsdp_with_a_clear_error():
    from omegaconf import OmegaConf

    from train.distill import make_accelerator
    from train.errors import SetupError

    tc = OmegaConf.create({"distributed": "fsdp", "anchor_sampling": "walk", "device": "cpu"})
    with pytest.raises(SetupError, match="anchor_sampling=walk"):
        make_accelerator(tc)
