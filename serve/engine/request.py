"""Per-request parameters, state and step outputs."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serve.engine.text import MAX_STOP_STRINGS, StopStrings

if TYPE_CHECKING:
    import torch


@dataclass
class SamplingParams:
    """temperature <= 0 is greedy; seed None = derived from the engine seed and request order;
    stop_token_ids extend the tokenizer's eos ids; ignore_eos keeps generating past eos;
    stop: strings that end generation where they appear in the decoded output (serve/engine/
    text.py; the output keeps the tokens up to the one completing the stop string)."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens}: must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0")
        if len(self.stop) > MAX_STOP_STRINGS or not all(self.stop):
            raise ValueError(
                f"stop={self.stop!r}: at most {MAX_STOP_STRINGS} strings, none of them empty"
            )


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    """What one engine step produced for one request: the new token ids (possibly empty),
    once finished finish_reason in {"stop", "length", "abort"}, and for a speculative round the
    drafts accepted (new_token_ids has accepted + 1 tokens unless a stop cut it short);
    stop_str: the stop string that finished the request (vLLM's `stop_reason`), else None."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    num_accepted: int | None = None
    stop_str: str | None = None


@dataclass
class Request:
    """Invariants while RUNNING: `anchor` (= output_ids[-1]) sits at position
    `num_computed` = prompt + output - 1; the target KV slot and the draft context hold
    exactly positions 0..num_computed-1.

    last_confidence: the confidences [N] (CPU float32, temperature-applied: what allocated its
    drafts) of the request's last spec round, kept only under
    `adaptive_budget_confidence="previous"` for the next round's budget; None before its first.
    stop_strings: the matcher of params.stop over the decoded output, None without stop strings.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    slot: int = -1
    num_computed: int = 0
    finish_reason: str | None = None
    last_confidence: torch.Tensor | None = None
    stop_strings: StopStrings | None = None  # only when params.stop is given

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def anchor(self) -> int:
        return self.output_ids[-1]
