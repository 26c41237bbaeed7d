"""The loss is taken exactly where the answers are, with the supervised positions derived here from
the rendered chat text, not from the code under test.

Rows go through the real pipeline (render with a template without generation markers, pack several
conversations per row), then `block_targets` and `distill_loss`. The reference: each
conversation's text is rendered by the tokenizer's own `apply_chat_template`, its assistant answers
(content + end-of-turn token) are located in that text with `str.index`, tokens overlapping them
are the supervised ones (character offsets from the tokenizer), and each conversation is found in
the packed row by its token ids. A block's slot j is supervised iff every label position from the
anchor's next token through slot j is supervised and in the anchor's conversation (a draft
proposal past an unsupervised token is never scored). The conversations' user turns are shorter
than a block, so blocks run from one answer across a user turn into the next: dropping the loss
mask or the cumulative product changes the mask (asserted below, so the test keeps its power).
"""

import types

import datasets
import pytest
import torch

from common.config import DSparkConfig
from common.model import DSparkDraftModel
from tests.integration.test_data import CHATML_NO_GENERATION, make_tokenizer
from tests.unit.test_train_loss import naive_loss
from train.data import build_dataset
from train.loop.loss import block_targets, distill_loss

SEQ_LEN, BLOCK = 256, 32  # a block spans a user turn (22 tokens here)
CONVERSATIONS = [
    [("Hello there, how are you today?", "I am fine."), ("And you?", "Fine, thank you.")],
    [("What is two plus two?", "The answer is four."), ("Sure?", "Yes, four.")],
    [("Write a haiku about the sea.", "Waves fold into foam."), ("More?", "Salt and light.")],
]


def messages(turns) -> list[dict]:
    out = [{"role": "system", "content": "Be brief."}]
    for question, answer in turns:
        out += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return out


def supervised_tokens(tok, turns) -> tuple[list[int], list[bool]]:
    """-> (the conversation's token ids, which are answer tokens): answers located in the text."""
    text = tok.apply_chat_template(
        messages(turns), tokenize=False, chat_template=CHATML_NO_GENERATION
    )
    spans, at = [], 0
    for _, answer in turns:
        start = text.index(answer + "<|im_end|>", text.index("<|im_start|>assistant\n", at))
        at = start + len(answer + "<|im_end|>")
        spans.append((start, at))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    sup = [any(a < e and b > s for s, e in spans) for a, b in enc["offset_mapping"]]
    return list(enc["input_ids"]), sup


def find(row: list[int], ids: list[int]) -> int:
    starts = [s for s in range(len(row) - len(ids) + 1) if row[s : s + len(ids)] == ids]
    assert len(starts) == 1, "each conversation appears once in the packed row"
    return starts[0]


def reference_mask(n_slots: int, sup: list[bool], doc: list[int], anchors: list[int]):
    """[A, n_slots] float64: slot j of the block at anchor a is scored iff positions a+1..a+1+j
    all exist, are answer tokens and lie in a's conversation."""
    out = torch.zeros(len(anchors), n_slots, dtype=torch.float64)
    for k, a in enumerate(anchors):
        for j in range(n_slots):
            span = range(a + 1, a + 2 + j)
            out[k, j] = all(q < len(sup) and sup[q] and doc[q] == doc[a] for q in span)
    return out


@pytest.fixture(scope="module")
def packed():
    tok = make_tokenizer()
    rows = datasets.Dataset.from_list([{"messages": messages(t)} for t in CONVERSATIONS])
    ds = build_dataset(rows, tok, SEQ_LEN, chat_template=CHATML_NO_GENERATION)
    assert len(ds) == 1, "the three conversations share one packed row"
    row = ds[0]
    ids = row["input_ids"]
    sup, doc = [False] * SEQ_LEN, [-1] * SEQ_LEN
    for d, turns in enumerate(CONVERSATIONS):
        conv_ids, conv_sup = supervised_tokens(tok, turns)
        s = find(ids, conv_ids)
        for i, flag in enumerate(conv_sup):
            sup[s + i], doc[s + i] = flag, d
    return tok, row, sup, doc


def test_block_slots_are_scored_exactly_where_the_text_has_answers(packed):
    _, row, sup, doc = packed
    ids = torch.tensor([row["input_ids"]])
    anchors = list(range(SEQ_LEN - 1))  # every position: blocks on answers, prompts, padding
    tg = block_targets(
        ids,
        torch.tensor([row["loss_mask"]]),
        torch.tensor([anchors]),
        torch.ones(1, len(anchors), dtype=torch.bool),
        BLOCK,
        torch.ones(ids.max() + 1, dtype=torch.bool),
        doc_ids=torch.tensor([row["doc_ids"]]),
    )
    ref = reference_mask(BLOCK, sup, doc, anchors)
    assert ref.sum() > 0
    assert torch.equal(tg.mask[0].double(), ref)
    # The test's power: the mask without the answers, or without the cumulative product, differs.
    everything = reference_mask(BLOCK, [True] * SEQ_LEN, doc, anchors)
    per_slot = torch.tensor(
        [
            [
                float(a + 1 + j < SEQ_LEN and sup[a + 1 + j] and doc[a + 1 + j] == doc[a])
                for j in range(BLOCK)
            ]
            for a in anchors
        ],
        dtype=torch.float64,
    )
    assert not torch.equal(everything, ref) and not torch.equal(per_slot, ref)


def test_the_loss_equals_a_float64_reference_on_the_text_derived_mask(packed):
    """distill_loss against the naive float64 loop of tests/unit/test_train_loss.py, fed the mask
    derived from the text (labels and label positions written out here too)."""
    tok, row, sup, doc = packed
    torch.manual_seed(0)
    v, ht = len(tok), 16
    cfg = DSparkConfig(
        vocab_size=v,
        target_hidden_size=ht,
        target_num_hidden_layers=4,
        target_layer_ids=[0, 1],
        mask_token_id=0,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        block_size=BLOCK,
        markov_rank=4,
    )
    m = DSparkDraftModel(cfg).double()
    m.init_from_target(torch.randn(v, 16), torch.randn(v, 16))
    for p in m.parameters():
        if p.requires_grad:
            p.data.normal_(0, 0.3)
    ids = torch.tensor([row["input_ids"]])
    answers = [a for a in range(SEQ_LEN - 1) if sup[a]]  # anchors on answer tokens
    anchors = torch.tensor([answers])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    aux = torch.randn(1, SEQ_LEN, 2 * ht, dtype=torch.float64)
    final = torch.randn(1, SEQ_LEN, ht, dtype=torch.float64)
    head = torch.randn(v, ht, dtype=torch.float64)
    nd = m.config.num_speculative_tokens
    tg = block_targets(
        ids,
        torch.tensor([row["loss_mask"]]),
        anchors,
        valid,
        nd,
        m.t2d,
        doc_ids=torch.tensor([row["doc_ids"]]),
    )
    fo = m.forward_train(aux, ids, anchors, valid)
    loss, _ = distill_loss(m, fo, tg, final, head, tg.dens())
    pos = torch.tensor([[min(a + 1 + j, SEQ_LEN - 1) for j in range(nd)] for a in answers])
    ref_tg = types.SimpleNamespace(
        mask=reference_mask(nd, sup, doc, answers)[None],
        label_pos=pos[None],
        labels=ids[0][pos][None],
    )
    ref = naive_loss(m, fo, ref_tg, final[0][None], head, ids)
    assert float(loss) == pytest.approx(float(ref), rel=1e-9, abs=1e-9)
