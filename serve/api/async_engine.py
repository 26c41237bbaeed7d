"""`AsyncEngine`: runs the (single-threaded) `Engine` in a background thread for asyncio callers.

The engine thread owns the engine: HTTP handlers never touch it, they post commands (add,
abort with its cause) to a thread-safe inbox and read their request's outputs from an asyncio
queue filled via `loop.call_soon_threadsafe`. Between two steps the thread drains the inbox, so
requests that arrive while a round runs are admitted at the next step (continuous batching).
When nothing is running it sleeps on the inbox instead of spinning.

Counting: every submitted request reaches the engine (the add is posted when `generate` is
called, and an add is applied even if its consumer already left), and the engine counts each
request once, by how it ended first: finished, aborted (engine error, shutdown, a consumer
closed without a cause) or disconnected (the HTTP layer's `abort(rid, "disconnect")`).

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
    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        closed_early: str = "abort",
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request now and return the iterator of its step outputs (until it
        finishes). The add is posted here, not on the first iteration, so a request whose
        response is never iterated (its client left at once) still reaches the engine and is
        counted. Closing the iterator early, or cancelling its consumer, aborts the request
        with cause `closed_early` (unless an `abort` came first); others are unaffected."""
        if not self.alive:
            raise EngineDeadError("the engine thread is not running")
        rid = request_id or f"req-{next(self._ids)}"
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[rid] = stream
        self._inbox.put(("add", rid, prompt_ids, params))
        return self._outputs(rid, stream, closed_early)

    async def _outputs(
        self, rid: str, stream: _Stream, closed_early: str
    ) -> AsyncIterator[RequestOutput]:
        ended = False  # the engine finished or failed it: nothing to abort
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    ended = True
                    raise item
                yield item
                if item.finished:
                    ended = True
                    return
        finally:
            self._streams.pop(rid, None)
            if not ended:
                self.abort(rid, closed_early)

    def abort(self, rid: str, cause: str = "abort") -> None:
        """Abort a request from any thread, counted under `cause` ("abort" or "disconnect")
        unless it already ended (the engine counts each request once)."""
        self._inbox.put(("abort", rid, cause))

    # ------------------------------------------------------------------ engine thread
    def _deliver(self, rid: str, item) -> None:
        s = self._streams.get(rid)
        if s is not None:
            s.loop.call_soon_threadsafe(s.queue.put_nowait, item)

    def _handle(self, cmd) -> None:
        if cmd[0] == "add":
            # Added even when its consumer is already gone: the abort posted after it follows
            # in the inbox, so the request is counted (as a disconnect or abort), never lost.
            _, rid, prompt_ids, params = cmd
            try:
                self.engine.add_request(prompt_ids, params, rid)
            except ValueError as e:  # the HTTP layer checks first; counted as aborted
                with self.engine.stats.updating() as st:
                    st.requests_aborted += 1
                self._deliver(rid, e)
        elif cmd[0] == "abort":
            self.engine.abort_request(cmd[1], cmd[2])

    def _fail_all(self, error: BaseException) -> None:
        """Abort every request in the engine (counted as aborted) and fail its consumer."""
        for rid in list(self.engine.requests):
            self.engine.abort_request(rid)
            self._deliver(rid, error)

    def _run(self) -> None:
        try:
            self._serve()
            # Stopped: requests still in flight or still in the inbox end as aborted.
            try:
                while True:
                    self._handle(self._inbox.get_nowait())
            except queue.Empty:
                pass
            self._fail_all(EngineDeadError("the server is shutting down"))
            if self.engine.has_unfinished():
                self.engine.step()  # flush the abort outputs
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
                self._fail_all(RuntimeError(f"engine step failed: {e}"))
                eng.step()  # flush the abort outputs and free the slots
                continue
            for out in outputs:
                self._deliver(out.request_id, out)
