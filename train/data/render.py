"""Render one row to `(input_ids, loss_mask)` with the target's tokenizer.

Contracts:
- chat rows, template with `{% generation %}` markers (the fast path): `apply_chat_template(...,
  return_assistant_tokens_mask=True)`; `loss_mask[i]` is True for tokens overlapping a marked block.
- chat rows, any other template: assistant spans found by incremental rendering (spans.py, whose
  docstring states exactly which tokens are assistant tokens: the content and the end-of-turn
  token(s) the model emits, never the role header or generation prompt, never the separator the
  template writes after the end-of-turn token). A template that is not prefix-stable supervises
  only the final assistant turn of such rows (counted), or is a `ChatTemplateError` when even that
  turn cannot be located; a template that drops the answer is a `ChatTemplateError`. Never an
  all-ones mask: training on prompts would teach the draft user text.
- `data.chat_template=FILE` overrides the tokenizer's template (either path applies to it);
  `template_kwargs` (e.g. {"enable_thinking": False}) go to the template.
- a regenerated chat row (a `regen` field, train.prepare.regenerate) supervises its final
assistant turn
  only: the target wrote that one; earlier assistant turns are the source data's answers, context
  the draft never proposes at serving time (counted as `regen_final_turn`).
- text rows: `tokenizer(text)` (so a BOS-requiring target gets its BOS) plus EOS; all supervised.
- both lists have the same length >= 1; ids are target-vocab ids.
"""

import os
import re
from dataclasses import dataclass, field

from train.data.rows import BadRowError, normalize_row
from train.data.spans import (
    DroppedContent,
    IncrementalRenderer,
    NoPromptedTurn,
    PrefixRejected,
    UnstableTemplate,
)

_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")

HOW_TO_FIX = (
    "Fix: pass a template that renders each turn after an unchanged history with "
    "data.chat_template=PATH (a .jinja file; wrapping assistant content in "
    "{% generation %}...{% endgeneration %} marks it explicitly), or convert the data to plain "
    "`text` rows."
)


class ChatTemplateError(ValueError):
    """The tokenizer/template cannot produce an assistant-token mask (config error)."""


def tokenizer_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def load_chat_template(spec: str | os.PathLike | None) -> str | None:
    """Resolve an override template: a path to a file, or an inline Jinja string, or None."""
    if spec is None:
        return None
    spec = os.fspath(spec)
    if os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            return f.read()
    if "{%" in spec or "{{" in spec:
        return spec
    raise FileNotFoundError(f"chat template file {spec!r} not found (data.chat_template=PATH)")


@dataclass
class Rendered:
    """One rendered row. `notes`: reasons (rows.REASONS keys) for turns dropped or a row changed."""

    ids: list[int]
    mask: list[bool]
    notes: list[str] = field(default_factory=list)


class Renderer:
    """Callable `(row, index) -> (input_ids: list[int], loss_mask: list[bool])`; `render(row,
    index) -> Rendered` also says what was dropped or changed.

    The chat template is resolved and checked lazily, on the first chat row, so a text-only dataset
    works with a tokenizer that has no chat template. Picklable (datasets hashes and ships it).
    `drop_bad_turns`: turns with empty content or an unknown role are dropped (and noted) instead
    of failing the row.
    """

    def __init__(
        self,
        tokenizer,
        chat_template: str | os.PathLike | None = None,
        template_kwargs: dict | None = None,
        drop_bad_turns: bool = False,
    ):
        self.tokenizer = tokenizer
        self.template_spec = None if chat_template is None else os.fspath(chat_template)
        self.chat_template = load_chat_template(chat_template)
        self.template_kwargs = dict(template_kwargs or {})
        self.drop_bad_turns = drop_bad_turns
        self._template_text = None

    @property
    def template_name(self) -> str:
        if self.template_spec is not None and os.path.isfile(self.template_spec):
            return f"data.chat_template={self.template_spec}"
        return f"the chat template of tokenizer {tokenizer_name(self.tokenizer)!r}"

    def _template(self) -> str:
        if self._template_text is None:
            try:
                self._template_text = self.tokenizer.get_chat_template(self.chat_template)
            except ValueError as e:
                raise ChatTemplateError(
                    f"tokenizer {tokenizer_name(self.tokenizer)!r} has no chat template ({e}). "
                    f"{HOW_TO_FIX}"
                ) from e
        return self._template_text

    def _apply(self, messages, **kwargs):
        import jinja2

        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self._template(), **self.template_kwargs, **kwargs
            )
        except jinja2.TemplateError as e:  # e.g. raise_exception('roles must alternate')
            raise _Rejected(str(e)) from e

    def render_chat(self, messages: list[dict], index: int) -> tuple[list[int], list[bool], bool]:
        """-> (ids, mask, final_turn_only)."""
        try:
            if _GENERATION_TAG.search(self._template()):
                ids, mask = self._render_marked(messages, index)
                return ids, mask, False
            spans = self._incremental().spans(messages)
        except _Rejected as e:
            raise BadRowError(
                index, f"chat template rejected the row: {e}", "template_rejected"
            ) from None
        except UnstableTemplate as e:
            raise ChatTemplateError(
                f"row {index}: {self.template_name} is not prefix-stable: {e}. The assistant "
                f"tokens cannot be located. {HOW_TO_FIX}"
            ) from None
        except PrefixRejected as e:
            raise ChatTemplateError(
                f"row {index}: {self.template_name} renders the row but not its first turns ({e}),"
                " so its assistant turns cannot be found by rendering turn by turn. "
                f"{HOW_TO_FIX}"
            ) from None
        except NoPromptedTurn as e:
            raise BadRowError(index, str(e), "no_assistant") from None
        except DroppedContent as e:
            raise ChatTemplateError(
                f"row {index}: {self.template_name} drops or rewrites assistant content: {e}. "
                f"{HOW_TO_FIX}"
            ) from None
        return spans.ids, spans.mask, spans.final_turn_only

    def _render_marked(self, messages, index):
        try:
            out = self._apply(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
        except (AttributeError, NotImplementedError) as e:  # slow tokenizers have no offsets
            raise ChatTemplateError(
                f"tokenizer {tokenizer_name(self.tokenizer)!r} cannot return an assistant mask "
                f"({e}); load a fast tokenizer (use_fast=True). {HOW_TO_FIX}"
            ) from e
        ids = list(out["input_ids"])
        mask = [bool(m) for m in out["assistant_masks"]]
        if not any(mask):
            # The row has non-empty assistant content (rows.py checks), so an empty mask means the
            # template drops or fails to mark it: refusing beats silently training on nothing.
            raise ChatTemplateError(
                f"row {index}: {self.template_name} marked no assistant tokens although the row "
                f"has assistant turns. {HOW_TO_FIX}"
            )
        return ids, mask

    def _incremental(self) -> IncrementalRenderer:
        tok = self.tokenizer
        if not getattr(tok, "is_fast", False):
            raise ChatTemplateError(
                f"tokenizer {tokenizer_name(tok)!r} is not a fast tokenizer; load it with "
                f"use_fast=True. {HOW_TO_FIX}"
            )
        special = set(tok.all_special_ids)

        def render(conversations, prompt):
            return self._apply(conversations, tokenize=False, add_generation_prompt=prompt)

        def encode(texts):  # exactly how apply_chat_template(tokenize=True) tokenizes
            return [list(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]

        def decode(ids):
            return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

        def is_blank(token_id):
            return token_id not in special and not decode([token_id]).strip()

        return IncrementalRenderer(render, encode, decode, is_blank)

    def render_text(self, text: str) -> tuple[list[int], list[bool]]:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ChatTemplateError(
                f"tokenizer {tokenizer_name(self.tokenizer)!r} has no eos_token; text rows need "
                "one to separate documents. Set tokenizer.eos_token."
            )
        ids = list(self.tokenizer(text)["input_ids"])
        if not ids or ids[-1] != eos:
            ids.append(eos)
        return ids, [True] * len(ids)

    def render(self, row, index: int) -> Rendered:
        notes: list[str] = []
        content = normalize_row(row, index, dropped=notes if self.drop_bad_turns else None)
        if isinstance(content, str):
            return Rendered(*self.render_text(content), notes)
        ids, mask, final_only = self.render_chat(content, index)
        notes += ["final_turn_only"] if final_only else []
        if isinstance(row, dict) and "regen" in row and not final_only:
            last = last_run(mask)
            if last != mask:  # earlier assistant turns: the source's answers, not the target's
                mask = last
                notes.append("regen_final_turn")
        return Rendered(ids, mask, notes)

    def __call__(self, row, index: int) -> tuple[list[int], list[bool]]:
        r = self.render(row, index)
        return r.ids, r.mask


def last_run(mask: list[bool]) -> list[bool]:
    """Only the last run of True in `mask`: the final assistant turn's tokens (a turn's tokens are
    one run, and a user turn separates two assistant turns)."""
    end = len(mask)
    while end and not mask[end - 1]:
        end -= 1
    start = end
    while start and mask[start - 1]:
        start -= 1
    return [start <= i < end for i in range(len(mask))]


class _Rejected(Exception):
    """The template raised while rendering (a row problem, not a config problem)."""
