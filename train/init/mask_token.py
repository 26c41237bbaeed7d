"""Which target token id feeds the draft's mask slots: chosen for the user, printed and recorded.

`draft.mask_token_id=N` wins; `draft.mask_token=STR` names a token that must be a single token of
the target tokenizer. `draft.mask_token=auto` (the default; null means the same) picks, in order:
1. the tokenizer's own `mask_token`;
2. a reserved added token (its name says reserved / unused / placeholder / control / mask, like
   Llama 3's `<|reserved_special_token_0|>`, Phi-3's `<|placeholder1|>`, Mistral's `[control_8]`)
   that never occurs in the training data;
3. an embedding row the tokenizer never produces (`len(tokenizer) <= id < vocab_size`, like
   Qwen3's id 151669): no text can ever tokenize to it;
4. another special added token that never occurs in the training data and is not written by the
   chat template, nor bos / eos / pad / unk;
5. the pad token, if it is never a supervised token (padding itself is never supervised);
else a `MaskTokenError` that says what to pass. Within a step the lowest id wins (deterministic).
"Never occurs" is checked on every non-padding token of the packed training rows.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

RESERVED_NAME = re.compile(r"reserved|unused|placeholder|control|mask", re.IGNORECASE)
AUTO = "auto"


class MaskTokenError(ValueError):
    """No usable mask token (config error, exit 2)."""


@dataclass(frozen=True)
class MaskToken:
    id: int
    token: str | None  # None for an embedding row without a token string
    how: str  # why this one, in words (printed, written to provenance and the model card)

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        name = f"{self.token!r} " if self.token is not None else ""
        return f"{name}(id {self.id}): {self.how}"


def _token_counts(train_ds, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(all non-padding tokens, supervised tokens) per id over packed rows: `[vocab_size]` each."""
    from train.data.counts import _flat

    seen = np.zeros(vocab_size, dtype=np.int64)
    supervised = np.zeros(vocab_size, dtype=np.int64)
    ds = train_ds.with_format("arrow", columns=["input_ids", "loss_mask", "doc_ids"])
    for batch in ds.iter(1024):
        ids = _flat(batch["input_ids"])
        real = _flat(batch["doc_ids"]) >= 0
        mask = _flat(batch["loss_mask"]).astype(bool)
        seen += np.bincount(ids[real], minlength=vocab_size)[:vocab_size]
        supervised += np.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return seen, supervised


def _template_text(tokenizer) -> str:
    try:
        return tokenizer.get_chat_template() or ""
    except (ValueError, TypeError):
        return ""


def choose_mask_token(dcfg, tokenizer, vocab_size: int, train_ds=None) -> MaskToken:
    """The mask token for `dcfg` (`draft.mask_token` / `draft.mask_token_id`), see module doc.
    `train_ds`: the packed training rows, needed to check that a candidate never occurs."""
    counts = _token_counts(train_ds, vocab_size) if train_ds is not None else None
    if dcfg.mask_token_id is not None:
        mid = int(dcfg.mask_token_id)
        known = tokenizer is not None and 0 <= mid < len(tokenizer)  # a bench draft has none
        token = tokenizer.convert_ids_to_tokens(mid) if known else None
        return _warn_if_seen(MaskToken(mid, token, "set by draft.mask_token_id"), counts)
    if dcfg.mask_token not in (None, AUTO):
        mid = tokenizer.convert_tokens_to_ids(dcfg.mask_token)
        if mid is None or (
            mid == tokenizer.unk_token_id and dcfg.mask_token != tokenizer.unk_token
        ):
            raise MaskTokenError(
                f"draft.mask_token={dcfg.mask_token!r} is not a single token of the target "
                "tokenizer: leave draft.mask_token=auto, or set draft.mask_token_id to a reserved "
                "token id"
            )
        return _warn_if_seen(
            MaskToken(int(mid), dcfg.mask_token, "set by draft.mask_token"), counts
        )
    return _auto(tokenizer, vocab_size, counts)


def _auto(tokenizer, vocab_size: int, counts) -> MaskToken:
    if tokenizer.mask_token is not None and tokenizer.mask_token_id is not None:
        return MaskToken(
            int(tokenizer.mask_token_id), tokenizer.mask_token, "the tokenizer's mask_token"
        )
    seen, supervised = counts if counts is not None else (None, None)
    never = lambda i: seen is not None and i < vocab_size and seen[i] == 0  # noqa: E731
    added = sorted((i, t.content) for i, t in tokenizer.added_tokens_decoder.items())
    for i, name in added:
        if RESERVED_NAME.search(name) and never(i):
            return MaskToken(i, name, "a reserved token that never occurs in the training data")
    if len(tokenizer) < vocab_size:
        i = len(tokenizer)
        return MaskToken(
            i,
            None,
            f"an embedding row no text tokenizes to (the tokenizer has {i} tokens, the "
            f"target's vocab {vocab_size})",
        )
    roles = {
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
    }
    template = _template_text(tokenizer)
    for i, name in added:
        special = tokenizer.added_tokens_decoder[i].special
        if special and i not in roles and name not in template and never(i):
            return MaskToken(
                i,
                name,
                "a special token that never occurs in the training data and is not "
                "written by the chat template",
            )
    pad = tokenizer.pad_token_id
    if pad is not None and supervised is not None and pad < vocab_size and supervised[pad] == 0:
        return MaskToken(int(pad), tokenizer.pad_token, "the pad token, never a supervised token")
    why = "" if counts is not None else " (the training data was not checked)"
    raise MaskTokenError(
        f"no mask token for the draft: the tokenizer declares no mask_token, has no reserved or "
        f"unused token that stays out of the training data, and no unused embedding row{why}. "
        "Set draft.mask_token_id=N to a token id the target never produces in your data (or "
        "draft.mask_token=STR for a single token of the tokenizer)"
    )


def _warn_if_seen(choice: MaskToken, counts) -> MaskToken:
    if counts is not None and 0 <= choice.id < len(counts[0]) and counts[0][choice.id]:
        print(
            f"[distill] warning: mask token id {choice.id} occurs {int(counts[0][choice.id])} "
            "times in the training data; its embedding then also means that text to the draft"
        )
    return choice
