"""Every admitted request ends in exactly one counter on /metrics: `vllm:request_success`,
`dspark:request_aborted` (server side: an engine step failed) or `dspark:request_disconnected`
(its client went away), whatever the stage: still in the HTTP layer's inbox before the engine
saw it, waiting for a slot in the engine, mid-stream, or running without streaming.

A real uvicorn server on 127.0.0.1 (in a thread, stopped at the end) and raw sockets, so a
client leaves exactly when the test says. The engine steps only on permits the test hands out,
which pins each request's stage when its client leaves. Every wait is bounded.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve.api import build_app
from serve.engine import Engine, EngineOptions
from tests.unit.test_engine_helpers import make_draft, make_target, make_tokenizer

pytestmark = pytest.mark.usefixtures("torch_single_thread")
WAIT_S = 60.0
COUNTERS = (
    "vllm:request_success_total",
    "dspark:request_aborted_total",
    "dspark:request_disconnected_total",
)


class PermittedSteps:
    """Wraps engine.step: each step takes a permit (`allow(n)`, or `open()` for all); `fail_at`
    makes the first step that sees that many requests in the engine raise."""

    def __init__(self, engine: Engine):
        self.engine, self.real = engine, engine.step
        self.permits = threading.Semaphore(0)
        self.fail_at = 0
        engine.step = self.step

    def step(self):
        assert self.permits.acquire(timeout=WAIT_S), "no step permit came"
        if self.fail_at and len(self.engine.requests) >= self.fail_at:
            self.fail_at = 0
            raise RuntimeError("injected step failure")
        return self.real()

    def allow(self, n: int = 1):
        for _ in range(n):
            self.permits.release()

    def open(self):
        self.allow(100_000)


def wait_for(cond, what: str):
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@contextmanager
def served(app):
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: server.started, "the server to start")
        yield base, port
    finally:
        server.should_exit = True
        thread.join(WAIT_S)


def raw_post(port: int, body: dict) -> socket.socket:
    """Send a POST /v1/completions on a raw socket and return it, unread."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    s.sendall(head.encode() + data)
    return s


def read_until(s: socket.socket, needle: bytes) -> bytes:
    got = b""
    while needle not in got:
        chunk = s.recv(4096)
        assert chunk, "the server closed the connection"
        got += chunk
    return got


def counters(base: str) -> dict:
    text = httpx.get(base + "/metrics", timeout=WAIT_S).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = s.value
    return out


def test_every_request_ends_in_exactly_one_counter():
    target = make_target(0, predictable=True, sharpness=30.0)
    draft = make_draft(target, True, None, tuned=True)
    opts = EngineOptions(target="<m>", checkpoint="<m>", dtype="float64", max_num_seqs=1)
    engine = Engine(target, draft, opts, make_tokenizer(), [])
    steps = PermittedSteps(engine)
    app = build_app(engine, "m")
    srv = app.state.server
    long = {"prompt": [5, 6], "max_tokens": 500, "temperature": 0, "ignore_eos": True}
    short = {**long, "max_tokens": 3}
    expected = dict.fromkeys(COUNTERS, 0)
    with served(app) as (base, port):
        assert {k: counters(base)[k] for k in COUNTERS} == expected  # all there, at zero
        # --- successes: one plain, one streamed.
        steps.open()
        assert httpx.post(base + "/v1/completions", json=short, timeout=WAIT_S).status_code == 200
        with httpx.stream(
            "POST", base + "/v1/completions", json={**short, "stream": True}, timeout=WAIT_S
        ) as r:
            assert "[DONE]" in r.read().decode()
        expected["vllm:request_success_total"] += 2
        wait_for(lambda: counters(base)["vllm:request_success_total"] == 2, "two successes")
        steps.permits = threading.Semaphore(0)  # hold the engine again

        # --- a holder takes the only slot; it runs while the others wait, then is aborted.
        holder = raw_post(port, {**long, "stream": True})
        wait_for(lambda: srv.admission.in_flight == 1, "the holder admitted")
        steps.allow(1)  # admits and prefills it: now it runs
        wait_for(lambda: len(engine.scheduler.running) == 1, "the holder running")

        # --- disconnects before the engine thread saw the request (its add still in the
        # inbox: the engine thread waits for a permit), streaming and not.
        for stream in (True, False):
            s = raw_post(port, {**short, "stream": stream})
            wait_for(lambda: srv.admission.in_flight == 2, "the request admitted")
            s.close()
            wait_for(lambda: srv.admission.in_flight == 1, "the server to see it leave")
            expected["dspark:request_disconnected_total"] += 1

        # --- disconnects while waiting in the engine for the slot, streaming and not.
        for stream in (True, False):
            s = raw_post(port, {**short, "stream": stream})
            wait_for(lambda: srv.admission.in_flight == 2, "the request admitted")
            steps.allow(1)  # the engine thread takes the add (and any aborts) into its queue
            wait_for(lambda: len(engine.scheduler.waiting) == 1, "the request waiting")
            s.close()
            wait_for(lambda: srv.admission.in_flight == 1, "the server to see it leave")
            expected["dspark:request_disconnected_total"] += 1
            steps.allow(1)  # applies the disconnect
            wait_for(lambda: not engine.scheduler.waiting, "the request dropped")

        # --- the holder's client leaves mid-stream, after its first tokens.
        read_until(holder, b"data: ")
        holder.close()
        expected["dspark:request_disconnected_total"] += 1
        steps.open()
        wait_for(lambda: not engine.requests, "the holder aborted")

        # --- a running non-streaming request whose client leaves.
        steps.permits = threading.Semaphore(0)
        s = raw_post(port, long)
        wait_for(lambda: srv.admission.in_flight == 1, "the request admitted")
        steps.allow(3)
        wait_for(lambda: len(engine.scheduler.running) == 1, "it running")
        s.close()
        expected["dspark:request_disconnected_total"] += 1
        wait_for(lambda: srv.admission.in_flight == 0, "the server to see it leave")
        steps.open()
        wait_for(lambda: not engine.requests, "it aborted")

        # --- server-side aborts: a step fails with two requests in flight (one streamed).
        steps.permits = threading.Semaphore(0)
        steps.fail_at = 2
        results = []
        threads = [
            threading.Thread(
                target=lambda b=b: results.append(
                    httpx.post(base + "/v1/completions", json=b, timeout=WAIT_S)
                )
            )
            for b in (long, {**long, "stream": True})
        ]
        for t in threads:
            t.start()
        wait_for(lambda: srv.admission.in_flight == 2, "both admitted")
        steps.open()
        for t in threads:
            t.join(WAIT_S)
        expected["dspark:request_aborted_total"] += 2
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 500]  # the stream reports its error in-band
        streamed = next(r for r in results if r.status_code == 200).text
        assert "injected step failure" in streamed

        wait_for(lambda: srv.admission.in_flight == 0 and not engine.requests, "all settled")
        got = counters(base)
    assert {k: got[k] for k in COUNTERS} == expected
    # Every request sent, exactly once: 2 successes, 6 disconnects (2 before the engine saw
    # them, 2 waiting for the slot, 1 mid-stream, 1 running unstreamed), 2 aborts.
    assert sum(expected.values()) == 10
    assert got["dspark:kv_slots_used"] == 0 and got["dspark:engine_requests"] == 0
