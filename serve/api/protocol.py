"""OpenAI-compatible request schemas, their validation, and error bodies.

Unknown fields are ignored (OpenAI clients send many defaults); fields whose non-default values
we cannot honour (n > 1, top_p < 1, logprobs, stop strings) are rejected with a 400 rather than
silently ignored. Extensions, as in vLLM: `seed`, `ignore_eos`, `stop_token_ids`,
`return_token_ids` (adds `token_ids` / `prompt_token_ids` to each choice).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError


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
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float | None = None
    n: int = 1
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False


def parse(model_cls: type[_Common], raw: bytes) -> _Common:
    """Bytes -> validated request, or APIError(400) saying what is wrong."""
    import json

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
    if req.n != 1:
        raise APIError("only n=1 is supported", param="n")
    if req.top_p is not None and req.top_p < 1.0:
        raise APIError("top_p < 1 is not supported by this engine", param="top_p")
    if req.stop:
        raise APIError("stop strings are not supported; use stop_token_ids", param="stop")
    if req.logprobs:
        raise APIError("logprobs are not supported", param="logprobs")
    if getattr(req, "echo", False):
        raise APIError("echo is not supported", param="echo")
    return req
