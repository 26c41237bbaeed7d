"""Render one row to `(input_ids, loss_mask)` with the target's tokenizer.

Contracts:
- chat rows: the target's chat template (or an override) via `apply_chat_template(...,
  return_assistant_tokens_mask=True)`; `loss_mask[i]` is True exactly for tokens inside the
  template's `{% generation %}` blocks (assistant turns). A template that cannot mark them is a
  `ChatTemplateError`, never an all-ones mask: training on prompts would teach the draft user text.
- text rows: `tokenizer(text)` (so a BOS-requiring target gets its BOS) plus EOS; all supervised.
- both lists have the same length >= 1; ids are target-vocab ids.
"""

import os
import re

from train.data.rows import BadRowError, normalize_row

_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")

HOW_TO_FIX = (
    "Fix: provide a chat template whose assistant content is wrapped in "
    "{% generation %}...{% endgeneration %} and pass it with data.chat_template=PATH "
    "(a .jinja file), or convert the data to plain `text` rows."
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


class Renderer:
    """Callable `(row, index) -> (input_ids: list[int], loss_mask: list[bool])`.

    The chat template is resolved and checked lazily, on the first chat row, so a text-only dataset
    works with a tokenizer that has no chat template. Picklable (datasets hashes and ships it).
    """

    def __init__(self, tokenizer, chat_template: str | os.PathLike | None = None):
        self.tokenizer = tokenizer
        self.chat_template = load_chat_template(chat_template)
        self._checked = False

    def _template(self) -> str:
        name = tokenizer_name(self.tokenizer)
        try:
            template = self.tokenizer.get_chat_template(self.chat_template)
        except ValueError as e:
            raise ChatTemplateError(
                f"tokenizer {name!r} has no chat template ({e}). {HOW_TO_FIX}"
            ) from e
        if not self._checked and not _GENERATION_TAG.search(template):
            raise ChatTemplateError(
                f"the chat template of tokenizer {name!r} has no {{% generation %}} markers, so "
                f"assistant tokens cannot be masked for the loss. {HOW_TO_FIX}"
            )
        self._checked = True
        return template

    def render_chat(self, messages: list[dict], index: int) -> tuple[list[int], list[bool]]:
        import jinja2

        template = self._template()
        try:
            out = self.tokenizer.apply_chat_template(
                messages,
                chat_template=template,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
        except jinja2.TemplateError as e:  # e.g. raise_exception('roles must alternate')
            raise BadRowError(index, f"chat template rejected the row: {e}") from e
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
                f"row {index}: the chat template of tokenizer {tokenizer_name(self.tokenizer)!r} "
                f"marked no assistant tokens although the row has assistant turns. {HOW_TO_FIX}"
            )
        return ids, mask

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

    def __call__(self, row, index: int) -> tuple[list[int], list[bool]]:
        content = normalize_row(row, index)
        if isinstance(content, str):
            return self.render_text(content)
        return self.render_chat(content, index)
