"""Assistant tokens of a chat template without `{% generation %}` markers, by incremental rendering.

`render.Renderer` uses this when the template cannot mark assistant tokens itself. Everything is
compared on token ids (the target's fast tokenizer, `add_special_tokens=False`, as
`apply_chat_template` tokenizes), so a span that is found is exact at the token level.

Notation, for the first k messages of a row: F_k = the render's ids without the generation prompt,
T_k = with it (`add_generation_prompt=True`), lcp = longest common prefix. For assistant message i:
- history H_i = lcp(F_i, T_i): what the template writes before turn i, without what it writes only
  at the end of a conversation (Phi-3 closes a prompt-less render with eos_token).
- turn Q_i = lcp(F_{i+1}, T_{i+1}): the conversation through message i, same rule. H_i must be a
  prefix of Q_i: rendering the answer must not change what came before it.
- header: the tokens of Q_i after H_i that match the generation prompt T_i[len(H_i):], as a token
  lcp. That is the whole generation prompt when the template renders a turn the way it prompts for
  it, and the shared part when it does not (DeepSeek-R1 prompts `<｜Assistant｜><think>\\n` but
  renders `<｜Assistant｜>answer`; Qwen3 with enable_thinking=false prompts with an empty think
  block, which is then header, not supervised).
- ASSISTANT TOKENS: the rest of Q_i after the header, without trailing whitespace-only tokens.
  That is the content and the end-of-turn token(s) the model must emit to stop (`<|im_end|>`,
  `<|eot_id|>`, `<end_of_turn>`, `</s>`, `<|end|>`, `<｜end▁of▁sentence｜>`); never the role header
  or generation prompt, never the newline ChatML and Gemma write after the end-of-turn token,
  never an end-of-conversation eos the template appends only without a generation prompt.
  An assistant message with nothing before it (index 0) is context: there is no prompt it answers.

Prefix-stable row: for every assistant turn, H_i + header + assistant tokens is a token prefix of
the full render F_n. The sample is F_n with every assistant turn supervised.

Not prefix-stable (the template rewrites earlier turns once a later one exists; Qwen3 renders the
`<think>` block only for turns after the last user message): the sample is Q_j for the last
assistant turn j, i.e. the conversation exactly as the template shows it when the model answers
turn j, and only turn j is supervised; earlier turns are context (`Spans.final_turn_only`, counted
in the data report). If turn j itself is not rendered after its own history (H_j not a prefix of
Q_j: Mistral's v3 template moves the system message into the last user turn, so it disappears
once an answer follows), that is a `ChatTemplateError`: no sample would match what the model sees.

Content check: every supervised turn must contain the message's visible text (what follows the
last `</think>`, compared without whitespace); a template that drops or rewrites the answer is a
`ChatTemplateError`, never a sample that trains on the wrong tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class UnstableTemplate(ValueError):
    """The final assistant turn is not rendered after its own history (see module doc)."""


class DroppedContent(ValueError):
    """A supervised span does not contain the assistant message's text (see module doc)."""


class PrefixRejected(ValueError):
    """The template renders the whole row but raises on one of its prefixes."""


class NoPromptedTurn(ValueError):
    """The row has no assistant message after index 0: nothing to supervise."""


@dataclass
class Spans:
    """`ids` [T] and `mask` [T] (True = assistant token) of one row; `final_turn_only`: the
    template was not prefix-stable for this row, so only its last assistant turn is supervised."""

    ids: list[int]
    mask: list[bool]
    final_turn_only: bool


def lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def visible_text(content: str) -> str:
    """The part of an assistant message every template renders: after the last `</think>`,
    without whitespace (templates trim, strip and re-space it)."""
    return "".join(content.split("</think>")[-1].split())


class IncrementalRenderer:
    """Find assistant spans of one row. `render(conversations, add_generation_prompt) -> [str]`
    renders several prefixes in one call, `encode([str]) -> [ids]` tokenizes a batch,
    `decode(ids) -> str`, `is_blank(id) -> bool` (a whitespace-only token)."""

    def __init__(
        self,
        render: Callable[[list[list[dict]], bool], list[str]],
        encode: Callable[[list[str]], list[list[int]]],
        decode: Callable[[list[int]], str],
        is_blank: Callable[[int], bool],
    ):
        self.render, self.encode, self.decode, self.is_blank = render, encode, decode, is_blank

    def _renders(self, messages: list[dict], turns: list[int]) -> dict[tuple[int, bool], list[int]]:
        """Ids of every prefix render the turns need, keyed (k, add_generation_prompt); k=0 is
        empty (nothing precedes the first message). Three render calls, one tokenizer call."""
        n = len(messages)
        full = self.render([messages], False)  # a template error here is the row's problem
        ks = sorted({n, *turns, *(i + 1 for i in turns)} - {0})
        keys = [(k, prompt) for prompt in (False, True) for k in ks if (k, prompt) != (n, False)]
        try:
            texts = []
            for prompt in (False, True):
                prefixes = [messages[:k] for k, p in keys if p == prompt]
                texts += self.render(prefixes, prompt) if prefixes else []
        except Exception as e:  # the template's own error, e.g. raise_exception(...)
            raise PrefixRejected(str(e)) from e
        out = dict(zip([(n, False), *keys], self.encode(full + texts)))
        return {**out, (0, False): [], (0, True): []}

    def spans(self, messages: list[dict]) -> Spans:
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0]
        if not turns:
            raise NoPromptedTurn("no assistant turn follows a prompt")
        renders = self._renders(messages, turns)

        def ids(k: int, prompt: bool) -> list[int]:
            return renders[k, prompt]

        pieces = {i: self._turn(i, ids) for i in turns}
        full = ids(len(messages), False)
        if all(p is not None and full[: p[1]] == p[2][: p[1]] for p in pieces.values()):
            mask = [False] * len(full)
            for i in turns:
                start, end, _ = pieces[i]
                self._check_content(messages[i], full[start:end], i)
                mask[start:end] = [True] * (end - start)
            return Spans(full, mask, final_turn_only=False)
        last = turns[-1]
        if pieces[last] is None:
            raise UnstableTemplate(
                f"message {last} (the last assistant turn) is not rendered after the history the "
                "template shows when prompting for it"
            )
        start, end, q = pieces[last]
        self._check_content(messages[last], q[start:end], last)
        return Spans(list(q), [start <= t < end for t in range(len(q))], final_turn_only=True)

    def _turn(self, i: int, ids) -> tuple[int, int, list[int]] | None:
        """(start, end, Q_i): assistant tokens Q_i[start:end] of message i, or None if the
        history changes once the answer is rendered."""
        f, t = ids(i, False), ids(i, True)
        h = lcp(f, t)
        qf, qt = ids(i + 1, False), ids(i + 1, True)
        q = qf[: lcp(qf, qt)]
        if q[:h] != f[:h]:
            return None
        start = h + lcp(t[h:], q[h:])
        end = len(q)
        while end > start and self.is_blank(q[end - 1]):
            end -= 1
        return start, end, q

    def _check_content(self, message: dict, span: list[int], i: int) -> None:
        want = visible_text(message["content"])
        got = "".join(self.decode(span).split())
        if not span or (want and want not in got):
            raise DroppedContent(
                f"message {i} (assistant): the template's rendering of the turn "
                f"{self.decode(span)!r:.120} does not contain the message's text "
                f"{message['content']!r:.80}"
            )
