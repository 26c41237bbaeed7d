"""The mask-slot token chosen for the user (train/init/mask_token.py): the tokenizer's own mask
token,
else a reserved token the data never uses, else an unused embedding row, else the pad token if it
is never supervised; overrides win; a clear error when nothing fits; recorded in the export."""

import json

import datasets
import pytest

from tests.integration.test_chat_templates import tiny_tokenizer
from tests.integration.test_distill import fast
from train.data import build_dataset
from train.distill import main
from train.init.mask_token import MaskTokenError, choose_mask_token

CHATML = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BASE = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class Draft(dict):
    __getattr__ = dict.__getitem__


AUTO = Draft(mask_token="auto", mask_token_id=None)


def make(specials, **kw):
    tok = tiny_tokenizer(specials, eos="<|im_end|>", **kw)
    tok.chat_template = CHATML
    return tok


def packed(tok, answers=("Paris.", "Rome."), text=None):
    rows = [
        {
            "messages": [
                {"role": "user", "content": "What is the capital?"},
                {"role": "assistant", "content": a},
            ]
        }
        for a in answers
    ]
    if text is not None:
        rows = [{"text": text}]
    return build_dataset(datasets.Dataset.from_list(rows), tok, 64)


def test_the_tokenizers_own_mask_token_wins():
    tok = make(BASE + ["<|reserved_special_token_0|>", "<mask>"], pad="<|endoftext|>")
    tok.mask_token = "<mask>"
    m = choose_mask_token(AUTO, tok, len(tok), packed(tok))
    assert (m.id, m.token, m.how) == (
        tok.convert_tokens_to_ids("<mask>"),
        "<mask>",
        "the tokenizer's mask_token",
    )


def test_a_reserved_token_the_data_never_uses():
    reserved = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]
    tok = make(BASE + reserved, pad="<|endoftext|>")
    m = choose_mask_token(AUTO, tok, len(tok), packed(tok))
    assert m.token == reserved[0] and "reserved" in m.how
    # Negative control: a reserved token that occurs in the data is passed over.
    used = packed(tok, answers=(f"Paris {reserved[0]}.", "Rome."))
    assert choose_mask_token(AUTO, tok, len(tok), used).token == reserved[1]


def test_an_embedding_row_the_tokenizer_never_produces():
    tok = make(BASE, pad="<|endoftext|>")
    m = choose_mask_token(AUTO, tok, len(tok) + 8, packed(tok))
    assert (m.id, m.token) == (len(tok), None) and "embedding row" in m.how


def test_only_a_pad_token_is_used_when_never_supervised():
    tok = make(BASE, pad="<|endoftext|>")
    m = choose_mask_token(AUTO, tok, len(tok), packed(tok))
    assert (m.token, m.how) == ("<|endoftext|>", "the pad token, never a supervised token")
    # Negative control: text rows are supervised on every token, eos included; pad == eos here.
    tok2 = make(["<|im_start|>", "<|im_end|>"], pad="<|im_end|>")
    with pytest.raises(MaskTokenError, match=r"no mask token.*draft.mask_token_id=N"):
        choose_mask_token(AUTO, tok2, len(tok2), packed(tok2, text="The capital is Paris."))


def test_special_tokens_of_the_template_or_the_data_are_not_chosen():
    tok = make(["<|im_start|>", "<|im_end|>", "<|tool|>"])  # <|im_start|>: in the template
    m = choose_mask_token(AUTO, tok, len(tok), packed(tok))
    assert m.token == "<|tool|>" and "special token" in m.how
    with pytest.raises(MaskTokenError, match="draft.mask_token_id"):
        choose_mask_token(AUTO, tok, len(tok), packed(tok, answers=("a <|tool|>", "b")))


def test_overrides_win_and_are_checked():
    tok = make(BASE + ["<|reserved_special_token_0|>"], pad="<|endoftext|>")
    ds = packed(tok)
    m = choose_mask_token(Draft(mask_token="auto", mask_token_id=1), tok, len(tok), ds)
    assert (m.id, m.token, m.how) == (1, "<|im_start|>", "set by draft.mask_token_id")
    m = choose_mask_token(Draft(mask_token="<|im_end|>", mask_token_id=None), tok, len(tok), ds)
    assert (m.id, m.how) == (tok.eos_token_id, "set by draft.mask_token")
    with pytest.raises(MaskTokenError, match="draft.mask_token='<|nope|>' is not a single token"):
        choose_mask_token(Draft(mask_token="<|nope|>", mask_token_id=None), tok, len(tok), ds)


def test_distill_picks_records_and_prints_the_mask_token(target, tmp_path, capsys):
    """The tiny random target's tokenizer has an undeclared `<|mask|>` (id 3)."""
    out = tmp_path / "run"
    assert main(fast(target, out, "trainer.max_steps=1")) == 0
    assert "[distill] mask token: '<|mask|>' (id 3): a reserved token" in capsys.readouterr().out
    assert json.loads((out / "final" / "config.json").read_text())["mask_token_id"] == 3
    prov = json.loads((out / "final" / "provenance.json").read_text())
    assert prov["mask_token"]["token"] == "<|mask|>" and prov["mask_token"]["id"] == 3
    card = (out / "final" / "README.md").read_text()
    assert "| Mask token id | 3 (`<\\|mask\\|>`, a reserved token" in card
