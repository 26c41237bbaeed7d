"""Tiny, fast, offline assets for training tests: a random Qwen3 target (tests/tiny.py) with a
BPE ChatML tokenizer (assistant-mask capable) and a small chat dataset. Built in seconds, no
downloads."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tests.tiny import save_random_target, tiny_target_config

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = "the quick brown fox jumps over lazy dog alpha beta gamma delta def class return".split()
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]


def make_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL))
    from tokenizers import decoders

    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = CHATML
    return tok


def chat_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        u = " ".join(rng.choices(WORDS, k=6))
        a = " ".join(rng.choices(WORDS, k=24))
        rows.append(
            {"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]}
        )
    return rows


def build_tiny_random_target(out: Path, layers: int = 4, hidden: int = 32, seed: int = 0) -> Path:
    """A random Qwen3 target + tokenizer + data/{train,heldout}.jsonl at `out`."""
    rows = chat_rows(120, seed) + chat_rows(20, seed + 1)
    tok = make_tokenizer([" ".join(WORDS)] * 50)
    cfg = tiny_target_config(
        len(tok), hidden, layers, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    save_random_target(out, cfg, tok, seed)
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name, part in (("train", rows[:120]), ("heldout", rows[120:])):
        (out / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return out
