"""OpenAI-compatible request schemas, their validation, and error bodies.

Validation runs in three passes, each answering a 400 whose `param` names the field:
1. types (pydantic);
2. bounds, as vLLM 0.34's `SamplingParams._verify_args` and request models check them (its
   messages too): temperature finite in [0, 2], top_p in (0, 1], top_k -1 or 0 (off) or >= 1,
   n >= 1, max_tokens / max_completion_tokens >= 1, min_p in [0, 1], presence and frequency
   penalties in [-2, 2], repetition_penalty > 0, min_tokens >= 0, at most 4 stop strings, none
   empty;
3. support: a field this engine cannot honour is rejected when it asks for something (a value
   other than its neutral one) rather than silently ignored: n > 1, logprobs, echo, penalties,
   logit_bias, min_p, tools, response formats other than text, ... (`UNSUPPORTED`). top_p < 1
   and top_k >= 1 are honoured only by greedy requests (temperature 0), which they do not change
   (vLLM resets them there); with sampling they are rejected.
Unknown fields are ignored (OpenAI clients send many). Extensions, as in vLLM: `seed`,
`ignore_eos`, `stop_token_ids`, `include_stop_str_in_output`, `return_token_ids` (adds
`token_ids` / `prompt_token_ids` to each choice).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serve.engine.text import MAX_STOP_STRINGS

_INT64 = 2**63


class APIError(Exception):
    """An error answered as OpenAI's `{"error": {...}}` body with `status`."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def response(self) -> JSONResponse:
        kind = {
            400: "BadRequestError",
            404: "NotFoundError",
            429: "RateLimitError",
            500: "InternalServerError",
            503: "ServiceUnavailableError",
        }.get(self.status, "BadRequestError")
        return JSONResponse(
            {
                "error": {
                    "message": self.message,
                    "type": kind,
                    "param": self.param,
                    "code": self.status,
                }
            },
            status_code=self.status,
        )


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = 1
    seed: int | None = Field(default=None, ge=-_INT64, lt=_INT64)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False
    # Known fields with no support here: validated, then rejected unless neutral (UNSUPPORTED).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    logit_bias: dict[str, float] | None = None
    use_beam_search: bool | None = None
    skip_special_tokens: bool | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def sampled(self) -> bool:
        return self.temperature is None or self.temperature > 0


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


def _bounds(req: _Common) -> None:
    """vLLM 0.34's bounds, its messages (a violation is rejected even where the value would
    not matter, e.g. top_p=2 with temperature 0: vLLM checks before its greedy reset)."""

    def bad(msg: str, param: str):
        raise APIError(msg, param=param)

    t = req.temperature
    if t is not None:
        if not math.isfinite(t):
            bad(f"temperature must be a finite number, got {t}.", "temperature")
        if not 0.0 <= t <= 2.0:
            bad(f"temperature must be in [0, 2], got {t}.", "temperature")
    if req.top_p is not None and not (math.isfinite(req.top_p) and 0.0 < req.top_p <= 1.0):
        bad(f"top_p must be in (0, 1], got {req.top_p}.", "top_p")
    if req.top_k is not None and req.top_k < -1:
        bad(f"top_k must be 0 (disable), or at least 1, got {req.top_k}.", "top_k")
    if req.n is not None and req.n < 1:
        bad(f"n must be at least 1, got {req.n}.", "n")
    for name in ("max_tokens", "max_completion_tokens"):
        v = getattr(req, name, None)
        if v is not None and v < 1:
            bad(f"{name} must be at least 1, got {v}.", name)
    if req.min_p is not None and not 0.0 <= req.min_p <= 1.0:
        bad(f"min_p must be in [0, 1], got {req.min_p}.", "min_p")
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(req, name)
        if v is not None and not -2.0 <= v <= 2.0:
            bad(f"{name} must be in [-2, 2], got {v}.", name)
    rp = req.repetition_penalty
    if rp is not None and not (math.isfinite(rp) and rp > 0.0):
        msg = f"repetition_penalty must be a finite number greater than zero, got {rp}."
        bad(msg, "repetition_penalty")
    if req.min_tokens is not None and req.min_tokens < 0:
        bad(f"min_tokens must be greater than or equal to 0, got {req.min_tokens}.", "min_tokens")
    stops = req.stop_list
    if len(stops) > MAX_STOP_STRINGS:
        bad(f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}.", "stop")
    if any(not s for s in stops):
        bad("stop cannot contain an empty string.", "stop")


def _neutral(*values) -> Callable[[Any], bool]:
    return lambda v: v is None or v in values


# field -> is its value neutral (asks for nothing this engine would have to do)?
UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "n": _neutral(1),
    # chat: a bool; completions: an int, where 0 already asks for the sampled token's logprob
    "logprobs": lambda v: v is None or v is False,
    "top_logprobs": _neutral(0),
    "prompt_logprobs": _neutral(),
    "logprob_token_ids": _neutral(),
    "echo": _neutral(False),
    "suffix": _neutral(""),
    "best_of": _neutral(1),
    "use_beam_search": _neutral(False),
    "presence_penalty": _neutral(0.0),
    "frequency_penalty": _neutral(0.0),
    "repetition_penalty": _neutral(1.0),
    "min_p": _neutral(0.0),
    "min_tokens": _neutral(0),
    "logit_bias": lambda v: not v,
    "allowed_token_ids": _neutral(),
    "bad_words": lambda v: not v,
    "skip_special_tokens": _neutral(True),
    "truncate_prompt_tokens": _neutral(),
    "response_format": lambda v: v is None or v.get("type") == "text",
    "structured_outputs": _neutral(),
    "guided_json": _neutral(),
    "guided_regex": _neutral(),
    "guided_choice": _neutral(),
    "guided_grammar": _neutral(),
    "tools": lambda v: not v,
    "tool_choice": _neutral("none", "auto"),
}


def _supported(req: _Common) -> None:
    for name, neutral in UNSUPPORTED.items():
        if name not in type(req).model_fields:
            continue
        v = getattr(req, name)
        if not neutral(v):
            raise APIError(
                f"{name}={json.dumps(v)} is not supported by this server"
                + (" (only n=1)" if name == "n" else ""),
                param=name,
            )
    # Top-p / top-k truncate the sampled distribution; greedy decoding is the same with them.
    if req.sampled:
        if req.top_p is not None and req.top_p < 1.0:
            raise APIError(
                f"top_p={req.top_p} with sampling is not supported by this server (top_p=1, or "
                "temperature=0)",
                param="top_p",
            )
        if req.top_k is not None and req.top_k >= 1:
            raise APIError(
                f"top_k={req.top_k} with sampling is not supported by this server (top_k=0 or "
                "-1, or temperature=0)",
                param="top_k",
            )


def parse(model_cls: type[_Common], raw: bytes) -> _Common:
    """Bytes -> validated request, or APIError(400) saying what is wrong and naming the field."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"malformed JSON body: {e}") from e
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object")
    try:
        req = model_cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise APIError(f"invalid request: {loc}: {first['msg']}", param=loc or None) from e
    _bounds(req)
    _supported(req)
    return req
