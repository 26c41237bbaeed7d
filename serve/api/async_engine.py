"""`AsyncEngine`: runs the (single-threaded) `Engine` in a background thread for asyncio callers.

The engine thread owns the engine: HTTP handlers never touch it, they post commands (add,
abort) to a thread-safe inbox and read their request's outputs from an asyncio queue filled via
`loop.call_soon_threadsafe`. Between two steps the thread drains the inbox, so requests that
arrive while a round runs are admitted at the next step (continuous batching). When nothing is
running it sleeps on the inbox instead of spinning.

With tp > 1 the engine is a `Lockstep` (serve/engine/lockstep.py): the same calls, each step
broadcast to the follower ranks; the thread also keeps idle followers alive and, on stopping,
releases them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from serve.engine import Engine, RequestOutput, SamplingParams
from serve.engine.lockstep import Lockstep

logger = logging.getLogger("serve.api")


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class EngineDeadError(RuntimeError):
    pass


class AsyncEngine:
    def __init__(self, engine: Engine | Lockstep):
        self.engine = engine
        self.lockstep = engine if isinstance(engine, Lockstep) else None
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dspark-engine", daemon=True)
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # ------------------------------------------------------------------ asyncio side
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's step outputs until it finishes. Cancelling the consumer (client
        gone) aborts the request in the engine; other requests are unaffected."""
        if not self.alive:
            raise EngineDeadError("the engine thread is not running")
        rid = request_id or f"req-{next(self._ids)}"
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[rid] = stream
        self._inbox.put(("add", rid, prompt_ids, params))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._inbox.put(("abort", rid))

    # ------------------------------------------------------------------ engine thread
    def _deliver(self, rid: str, item) -> None:
        s = self._streams.get(rid)
        if s is not None:
            s.loop.call_soon_threadsafe(s.queue.put_nowait, item)

    def _handle(self, cmd) -> None:
        if cmd[0] == "add":
            _, rid, prompt_ids, params = cmd
            if rid not in self._streams:  # cancelled before it reached the engine
                return
            try:
                self.engine.add_request(prompt_ids, params, rid)
            except ValueError as e:
                self._deliver(rid, e)
        elif cmd[0] == "abort":
            self.engine.abort_request(cmd[1])

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            if self.lockstep is not None:
                self.lockstep.close()

    def _serve(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            try:
                # Block only when idle; otherwise just drain what arrived during the last step.
                block = not eng.has_unfinished()
                cmd = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
                self._handle(cmd)
                while True:
                    self._handle(self._inbox.get_nowait())
            except queue.Empty:
                pass
            if not eng.has_unfinished():
                if self.lockstep is not None:
                    self.lockstep.keepalive()
                continue
            try:
                outputs = eng.step()
            except Exception as e:  # keep serving: fail the requests in flight, free their slots
                logger.exception("engine step failed; aborting the requests in flight")
                for rid in list(eng.requests):
                    eng.abort_request(rid)
                    self._deliver(rid, RuntimeError(f"engine step failed: {e}"))
                eng.step()  # flush the abort outputs and free the slots
                continue
            for out in outputs:
                self._deliver(out.request_id, out)
