"""Byte-level BPE tokenizer and ChatML template for the tiny target.

Design choices:
- Qwen2-style pre-tokenizer regex: a newline run is its own piece (`\\s*[\\r\\n]+`), so indentation
  never merges with the newline before it. That keeps the chat template's "assistant\\n" header and
  the assistant content in separate tokens, which is what makes the assistant mask exact.
- Special tokens get the first ids, in `SPECIAL_TOKENS` order (pinned by
tests/integration/test_tiny_target.py).
  `<|mask|>` is never seen in training: it exists so a DSpark draft has a dedicated mask-slot id.
- eos is `<|im_end|>` (a chat model stops at the end of its turn); pad is `<|endoftext|>`, which
  also separates packed documents during training.
- The template wraps assistant content *and its closing `<|im_end|>`* in `{% generation %}`: the
  model must learn to emit the end-of-turn token, so it is a training target. The header
  `<|im_start|>assistant\\n` and the "\\n" after `<|im_end|>` are outside (mask 0).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MASK)  # ids 0, 1, 2, 3

# Qwen2's split pattern (GPT-4 style, digits split singly, newline runs isolated).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE (`tokenizers`) on `texts`; deterministic for the same input order."""
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size={vocab_size} must exceed 256 bytes + specials; use >= 512")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no <unk>
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t!r} got id {tok.token_to_id(t)}, expected {i}")
    return tok


def wrap_tokenizer(tok: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    """HF fast tokenizer with eos/pad/mask set and the generation-tagged ChatML template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        mask_token=MASK,
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
