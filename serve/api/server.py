"""OpenAI-compatible HTTP server over the embedded engine (`run_server`).

Routes: POST /v1/completions, POST /v1/chat/completions (both `stream: true` as SSE ending in
`data: [DONE]`), GET /v1/models, /health, /metrics (Prometheus, vLLM names).
Errors are OpenAI-style `{"error": {message, type, param, code}}` bodies: 400 for malformed
JSON / invalid fields / token limits, 404 for an unknown model, 429 when `max_queued` requests
already wait for a slot (answered at once: a full server never leaves a client hanging), 503 when
the engine is down.
The acceptance watchdog (serve/watchdog.py) runs when the checkpoint records its acceptance: it
is fed every `WATCHDOG_INTERVAL_S` and on each /metrics scrape, warns on the log and exposes
`dspark:acceptance_watchdog_*` gauges.
A client that disconnects (mid-stream or while waiting) has its request aborted; the others
keep running.
`stop` strings (at most 4) end a completion where they first appear in its text, streaming or
not; the text excludes them (`include_stop_str_in_output` keeps them) and finish_reason is
"stop" (serve/engine/text.py). While streaming, text that could begin a stop string is held
back until the next tokens decide it.
Counters: every request admitted ends in exactly one of `vllm:request_success` (finished:
stop or length), `dspark:request_aborted` (engine error, shutdown) and
`dspark:request_disconnected` (its client went away first); requests refused with an error
status (400, 404, 429, 503) are in none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import torch.distributed as dist
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serve.api.async_engine import AsyncEngine
from serve.api.metrics import make_registry, render
from serve.api.protocol import APIError, ChatCompletionRequest, CompletionRequest, parse
from serve.engine import Engine, EngineOptions, RequestOutput, SamplingParams
from serve.engine.lockstep import Lockstep, follow, join_tp_world
from serve.engine.text import IncrementalDetokenizer, cut_at_stop, held_back
from serve.watchdog import AcceptanceWatchdog, WatchdogRule, expected_acceptance

logger = logging.getLogger("serve.api")
WATCHDOG_INTERVAL_S = 5.0
DEFAULT_MAX_QUEUED = 256  # requests waiting for a slot beyond the max_num_seqs running ones


class Admission:
    """Requests admitted and not finished; `release` is idempotent (a stream may end through its
    generator's `finally` and through the response's background task)."""

    def __init__(self, limit: int):
        self.limit, self.in_flight = limit, 0

    def try_admit(self):
        if self.in_flight >= self.limit:
            return None
        self.in_flight += 1
        done = False

        def release():
            nonlocal done
            if not done:
                done = True
                self.in_flight -= 1

        return release


class TextOutput:
    """The text a client receives of a growing output (serve/engine/text.py decodes it the way
    the engine matched stop strings in it): without stop strings every completed character goes
    out; with them, the output ends where the matched stop string starts (or, with
    `include_stop`, where it ends) and, until the end, a tail that could still become a stop
    string is held back."""

    def __init__(self, tokenizer, stops: list[str], include_stop: bool = False):
        self.detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.stops, self.include_stop = stops, include_stop
        self.ids: list[int] = []
        self.sent = ""

    def push(self, out: RequestOutput) -> str:
        """The text to send for this step output."""
        self.ids += out.new_token_ids
        if self.detok is None:
            return ""
        for t in out.new_token_ids:
            self.detok.push(t)
        if out.finished:
            self.detok.flush()
            text = self.detok.text
            if out.stop_str is not None:
                text = cut_at_stop(text, out.stop_str, self.include_stop)
            end = len(text)
        else:
            text = self.detok.text
            end = len(text) - (held_back(text[len(self.sent) :], self.stops) if self.stops else 0)
        delta = text[len(self.sent) : end]
        self.sent += delta
        return delta


class EngineStream(StreamingResponse):
    """An SSE response whose `on_close` runs however it ends: sent in full, its client gone
    (Starlette then cancels the body without closing it), or its task cancelled. The body is
    closed here too, so its request is settled now rather than when it is garbage-collected."""

    def __init__(self, body, on_close: Callable[[], None]):
        super().__init__(body, media_type="text/event-stream")
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
            await self.body_iterator.aclose()


def response_metrics(rounds: list[int]) -> dict | None:
    """A response's `metrics` with its own acceptance in vLLM's shape (`speculative_decoding`,
    vLLM >= 0.29 with `--per-request-spec-decode-metrics summary`, the fields we can state
    exactly): `rounds` holds the drafts accepted in each speculative round; None for none."""
    if not rounds:
        return None
    accepted = sum(rounds)
    spec = {
        "mean_acceptance_length": 1.0 + accepted / len(rounds),
        "num_spec_steps": len(rounds),
        "num_accepted_draft_tokens": accepted,
    }
    return {"speculative_decoding": spec}


class Server:
    """Request handling shared by the routes; owns the AsyncEngine."""

    def __init__(
        self,
        engine: Engine | Lockstep,
        served_model_name: str,
        watchdog_rule: WatchdogRule | None = None,
        max_queued: int = DEFAULT_MAX_QUEUED,
    ):
        if max_queued < 0:
            raise ValueError(f"max_queued={max_queued}: must be >= 0")
        self.engine, self.name = engine, served_model_name
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.opts.max_model_len
        self.aengine = AsyncEngine(engine)
        self.max_queued = max_queued
        self.admission = Admission(engine.opts.max_num_seqs + max_queued)
        expected = expected_acceptance(engine.opts.checkpoint) if engine.num_spec else None
        self.watchdog = AcceptanceWatchdog(expected, watchdog_rule) if expected else None
        self.registry = make_registry(engine, served_model_name, self.watchdog)

    def watch_acceptance(self):
        """One watchdog reading from the engine's current counters (None without a watchdog)."""
        if self.watchdog is None:
            return None
        return self.watchdog.observe(self.engine.stats.snapshot().spec)

    async def watch_forever(self) -> None:
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            self.watch_acceptance()

    # ------------------------------------------------------------------ inputs
    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise APIError(f"The model `{model}` does not exist.", 404, "model")

    def completion_prompt(self, req: CompletionRequest) -> list[int]:
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], (list, str)):
            if len(p) != 1:
                raise APIError("batched prompts are not supported: send one prompt", param="prompt")
            p = p[0]
        if isinstance(p, str):
            if self.tokenizer is None:
                raise APIError("this target has no tokenizer: send token ids", param="prompt")
            return self.tokenizer.encode(p)
        return list(p)

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        tok = self.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise APIError("the target tokenizer has no chat template", param="messages")
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already wrote any BOS it wants.
        return tok.encode(text, add_special_tokens=False)

    def sampling_params(self, req, prompt_ids: list[int]) -> SamplingParams:
        if not prompt_ids:
            raise APIError("the prompt is empty", param="prompt")
        n = len(prompt_ids)
        if n >= self.max_model_len:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt has {n} tokens, leaving no room to generate.",
                param="prompt",
            )
        vocab = self.engine.target.lm_head.weight.shape[0]
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise APIError(f"prompt token ids must lie in [0, {vocab})", param="prompt")
        room = self.max_model_len - n
        max_tokens = getattr(req, "max_completion_tokens", None)
        if max_tokens is None:
            max_tokens = req.max_tokens
        if max_tokens is None:
            max_tokens = room
        if max_tokens > room:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {n + max_tokens} tokens ({n} in the prompt, {max_tokens} in the "
                "completion). Reduce the prompt or max_tokens.",
                param="max_tokens",
            )
        if req.stop_list and self.tokenizer is None:
            raise APIError("this target has no tokenizer: use stop_token_ids", param="stop")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            seed=req.seed,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            stop=req.stop_list,
        )

    # ------------------------------------------------------------------ outputs
    async def run(self, raw: bytes, http: Request, chat: bool) -> Response:
        if not self.aengine.alive:
            raise APIError("the engine is not running", 503)
        req = parse(ChatCompletionRequest if chat else CompletionRequest, raw)
        self.check_model(req.model)
        prompt_ids = self.chat_prompt(req) if chat else self.completion_prompt(req)
        params = self.sampling_params(req, prompt_ids)
        release = self.admission.try_admit()
        if release is None:
            raise APIError(
                f"the server is at capacity: {self.admission.in_flight} requests in flight "
                f"(max_num_seqs={self.engine.opts.max_num_seqs} running + max_queued="
                f"{self.max_queued} waiting). Retry later.",
                429,
            )
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        # A stream closed before its end means its client went away (Starlette cancels the
        # body on a disconnect); a non-streaming handler posts the disconnect itself.
        closed_early = "disconnect" if req.stream else "abort"
        try:
            # The engine has the request from here: it counts how it ends.
            gen = self.aengine.generate(prompt_ids, params, rid, closed_early)
        except BaseException:
            release()
            raise
        text = TextOutput(self.tokenizer, params.stop, req.include_stop_str_in_output)
        if req.stream:
            include_usage = bool((req.stream_options or {}).get("include_usage"))
            ended = [False]  # the engine finished or failed it

            def on_close():
                release()
                if not ended[0]:  # the client went away first (the engine counts each once)
                    self.aengine.abort(rid, "disconnect")

            body = self._stream(
                gen, text, ended, rid, prompt_ids, chat, include_usage, req.return_token_ids
            )
            return EngineStream(body, on_close)
        try:
            want_ids = req.return_token_ids
            return await self._complete(gen, text, http, rid, prompt_ids, chat, want_ids)
        finally:
            release()

    def _usage(self, prompt_ids, out_ids):
        n, m = len(prompt_ids), len(out_ids)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}

    async def _complete(
        self, gen, text: TextOutput, http: Request, rid, prompt_ids, chat, want_ids
    ) -> Response:
        reason, rounds = None, []

        async def collect():
            nonlocal reason
            async for out in gen:
                text.push(out)
                reason = out.finish_reason
                if out.num_accepted is not None:
                    rounds.append(out.num_accepted)

        task = asyncio.ensure_future(collect())
        try:
            # A non-streaming client that goes away must not keep its request running.
            while not task.done():
                await asyncio.wait([task], timeout=0.25)
                if not task.done() and await http.is_disconnected():
                    self.aengine.abort(rid, "disconnect")  # before the close's plain abort
                    return Response(status_code=499)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await gen.aclose()
        exc = task.exception()
        if exc is not None:
            raise APIError(str(exc), 400 if isinstance(exc, ValueError) else 500)
        choice = {"index": 0, "finish_reason": reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text.sent}
        else:
            choice["text"] = text.sent
        if want_ids:
            choice["token_ids"], choice["prompt_token_ids"] = text.ids, prompt_ids
        body = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [choice],
            "usage": self._usage(prompt_ids, text.ids),
        }
        metrics = response_metrics(rounds)
        if metrics is not None:
            body["metrics"] = metrics
        return JSONResponse(body)

    async def _stream(
        self, gen, text: TextOutput, ended: list, rid, prompt_ids, chat, include_usage, want_ids
    ) -> AsyncIterator[str]:
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict, usage=None, metrics=None) -> str:
            body = {"id": rid, "object": obj, "created": created, "model": self.name}
            body["choices"] = [choice] if choice is not None else []
            if usage is not None:
                body["usage"] = usage
            if metrics is not None:
                body["metrics"] = metrics
            return f"data: {json.dumps(body)}\n\n"

        rounds = []

        try:
            if chat:
                yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""}})
            async for out in gen:
                ended[0] = out.finished
                delta = text.push(out)
                if out.num_accepted is not None:
                    rounds.append(out.num_accepted)
                choice = {"index": 0, "finish_reason": out.finish_reason, "logprobs": None}
                if chat:
                    choice["delta"] = {"content": delta} if delta else {}
                else:
                    choice["text"] = delta
                if want_ids:
                    choice["token_ids"] = out.new_token_ids
                yield chunk(choice)
            if include_usage:  # where vLLM puts each request's own acceptance too
                yield chunk(None, self._usage(prompt_ids, text.ids), response_metrics(rounds))
        except Exception as e:  # headers are sent: report in-band, as vLLM does
            ended[0] = True
            err = {"error": {"message": str(e), "type": "InternalServerError", "code": 500}}
            yield f"data: {json.dumps(err)}\n\n"
        finally:
            await gen.aclose()  # not finished: aborts it (a disconnect was posted first)
        yield "data: [DONE]\n\n"


def build_app(
    engine: Engine | Lockstep,
    served_model_name: str,
    watchdog_rule: WatchdogRule | None = None,
    max_queued: int = DEFAULT_MAX_QUEUED,
) -> FastAPI:
    """The FastAPI app; the engine thread (and the watchdog's timer) start and stop with the app's
    lifespan."""
    srv = Server(engine, served_model_name, watchdog_rule, max_queued)

    @asynccontextmanager
    async def lifespan(_app):
        srv.aengine.start()
        timer = asyncio.ensure_future(srv.watch_forever()) if srv.watchdog else None
        if srv.watchdog is None and engine.num_spec:
            logger.info("acceptance watchdog off: the checkpoint records no acceptance")
        yield
        if timer is not None:
            timer.cancel()
        srv.aengine.shutdown()

    app = FastAPI(title="dspark", lifespan=lifespan)
    app.state.server = srv

    @app.exception_handler(APIError)
    async def _api_error(_req, exc: APIError):
        return exc.response()

    @app.get("/health")
    async def health():
        if not srv.aengine.alive:
            return JSONResponse({"status": "engine dead"}, status_code=503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        card = {
            "id": srv.name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "dspark",
            "root": engine.opts.target,
            "max_model_len": srv.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics():
        return Response(render(srv.registry), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await srv.run(await request.body(), request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await srv.run(await request.body(), request, chat=True)

    return app


def run_server(
    opts: EngineOptions,
    host: str,
    port: int,
    served_model_name: str | None = None,
    max_queued: int = DEFAULT_MAX_QUEUED,
) -> None:
    """Load the engine from `opts` and serve until interrupted (blocking). With `opts.tp > 1`
    every rank calls this (e.g. under torchrun): rank 0 serves, the others follow it
    (serve/engine/lockstep.py); `OptionsError` when no world of tp ranks is there or can be made."""
    import uvicorn

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    owns_world = join_tp_world(opts.tp, opts.device)
    try:
        engine = Engine.from_options(opts)
        if opts.tp > 1 and dist.get_rank() > 0:
            try:
                steps = follow(engine)
            except KeyboardInterrupt:  # torchrun passes a Ctrl-C to every rank
                return
            logger.info("rank %d: rank 0 closed after %d steps", dist.get_rank(), steps)
            return
        name = served_model_name or opts.target
        mode = f"DSpark N={engine.num_spec}" if engine.num_spec else "target-only"
        if opts.tp > 1:
            mode += f", tp={opts.tp}"
        logger.info("serving %s (%s) on http://%s:%d", name, mode, host, port)
        driven = Lockstep(engine) if opts.tp > 1 else engine
        app = build_app(driven, name, max_queued=max_queued)
        uvicorn.run(app, host=host, port=port, log_level="info")
    finally:
        if owns_world:
            dist.destroy_process_group()
