"""Output text and stop strings: one incremental detokenizer for the engine and the HTTP layer.

Design choices:
- `IncrementalDetokenizer` decodes token by token over a sliding window (the previous token as
  context, as TGI and vLLM do), so each token's text costs two short decodes and the text after
  k tokens equals `tokenizer.decode(ids[:k], skip_special_tokens=True)` for tokenizers whose
  decode is prefix-stable. A token that ends inside a multi-byte character adds nothing until
  the character is complete (its text would end in U+FFFD); `flush` writes what is left.
- Stop strings are matched by the engine (`StopStrings`, built only for requests that give
  some: the decode loop of a request without stop strings does no string work). A stop string
  ends generation at the token that completes it, even mid-way through a speculative round: the
  later tokens of that round are dropped. Among several stop strings the one that completes
  first in the text wins (ties: list order), which is what appending one token at a time
  would find; vLLM 0.34's `check_stop_strings` picks the same one.
- The HTTP layer decodes the same tokens with the same class, cuts the text where the matched
  stop string starts (`cut_at_stop`), and while streaming holds back any tail that could still
  become a stop string (`held_back`), so a stop string split across tokens or rounds is never
  sent in part.
"""

from __future__ import annotations

from bisect import bisect_left

MAX_STOP_STRINGS = 4  # OpenAI's limit, and vLLM 0.34's default (VLLM_MAX_STOP_STRINGS)


class IncrementalDetokenizer:
    """`text` of the ids pushed so far (special tokens skipped)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # window start: context for the next token's leading space
        self._read = 0  # ids up to here are in `text`

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add one token; returns the text it completed ("" while a character is incomplete)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        delta = after[len(before) :]
        self.text += delta
        self._prefix, self._read = self._read, len(self.ids)
        return delta

    def flush(self) -> str:
        """The end of the output: write any incomplete character's bytes (as U+FFFD)."""
        if self._read == len(self.ids):
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        delta = self._decode(self.ids[self._prefix :])[len(before) :]
        self.text += delta
        self._prefix = self._read = len(self.ids)
        return delta


def earliest_stop(text: str, stops: list[str], checked: int) -> tuple[str, int] | None:
    """The stop string completing first in `text` after its first `checked` characters (which
    held none), with its start; None if none completes."""
    best, best_start, best_end = None, -1, len(text) + 1
    for s in stops:
        i = text.find(s, max(0, checked - len(s) + 1))
        if i != -1 and i + len(s) < best_end:
            best, best_start, best_end = s, i, i + len(s)
    return None if best is None else (best, best_start)


class StopStrings:
    """A request's stop strings, matched in its decoded output as tokens arrive."""

    def __init__(self, tokenizer, stops: list[str]):
        self.stops = list(stops)
        self.detok = IncrementalDetokenizer(tokenizer)

    def push(self, tokens: list[int]) -> tuple[int, str] | None:
        """Add a step's tokens; if a stop string completes, (how many of `tokens` to keep: up
        to the one completing it, the stop string matched)."""
        checked = len(self.detok.text)
        ends = []  # text length after each token
        for t in tokens:
            self.detok.push(t)
            ends.append(len(self.detok.text))
        hit = earliest_stop(self.detok.text, self.stops, checked)
        if hit is None:
            return None
        stop, start = hit
        return bisect_left(ends, start + len(stop)) + 1, stop


def cut_at_stop(text: str, stop: str, include: bool = False) -> str:
    """The output text of a request the engine stopped on `stop`: up to where it starts (first
    occurrence: none completed earlier), or through its end with `include`."""
    i = text.find(stop)
    if i == -1:  # cannot happen when text holds the engine's tokens; keep the text whole
        return text
    return text[: i + len(stop)] if include else text[:i]


def held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` could be the start of a stop string (the longest
    suffix that is a proper prefix of one): they wait until the next tokens decide."""
    longest = min(len(text), max((len(s) for s in stops), default=1) - 1)
    for k in range(longest, 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0
