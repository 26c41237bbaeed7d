"""The HTTP app in process (FastAPI TestClient runs the app's lifespan, so the engine thread
really batches concurrent requests): /metrics equals the engine's own counters, and a failing
engine step fails only the requests in flight."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from serve.api import build_app
from serve.engine import Engine, EngineOptions
from tests.unit.test_engine_helpers import make_draft, make_target, reference_greedy

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def scrape(client) -> dict:
    out = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            pos = s.labels.get("position")
            out[s.name if pos is None else f"{s.name}[{pos}]"] = s.value
    return out


def test_metrics_equal_engine_counters():
    target = make_target(0, predictable=True, sharpness=30.0)
    draft = make_draft(target, True, 40, tuned=True, strength=3.0)
    opts = EngineOptions(target="<memory>", checkpoint="<memory>", dtype="float64", max_num_seqs=3)
    engine = Engine(target, draft, opts, eos_token_ids=[])
    with TestClient(build_app(engine, "m")) as client:

        def run(i):
            body = {"prompt": [5 + i, 9], "max_tokens": 6 + 5 * i, "temperature": 0.1 * i}
            body["seed"] = i
            if i % 2:
                body["stream"] = True
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text

        with ThreadPoolExecutor(6) as pool:
            list(pool.map(run, range(6)))
        m = scrape(client)
    spec = engine.stats.spec
    assert spec.num_drafts > 0 and spec.num_accepted_tokens > 0
    assert m["vllm:spec_decode_num_drafts_total"] == spec.num_drafts
    assert m["vllm:spec_decode_num_draft_tokens_total"] == spec.num_draft_tokens
    # No adaptive verification: every scheduled draft token was verified.
    verified = m["dspark:spec_decode_num_verified_draft_tokens_total"]
    assert verified == spec.num_verified_draft_tokens == spec.num_draft_tokens
    assert m["vllm:spec_decode_num_accepted_tokens_total"] == spec.num_accepted_tokens
    for k, v in enumerate(spec.num_accepted_tokens_per_pos):
        assert m[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{k}]"] == v
    pooled = (
        1 + m["vllm:spec_decode_num_accepted_tokens_total"] / m["vllm:spec_decode_num_drafts_total"]
    )
    assert pooled == pytest.approx(spec.mean_acceptance_length)
    assert m["vllm:generation_tokens_total"] == sum(6 + 5 * i for i in range(6))
    assert m["vllm:request_success_total"] == 6
    assert m["vllm:num_requests_running"] == 0


def test_engine_failure_fails_in_flight_requests_and_keeps_serving():
    target = make_target(0)
    opts = EngineOptions(target="<memory>", checkpoint="<memory>", dtype="float64")
    engine = Engine(target, make_draft(target), opts, eos_token_ids=[])
    real_round = engine._spec_round
    calls = {"n": 0}

    def flaky(reqs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure")
        return real_round(reqs)

    engine._spec_round = flaky
    with TestClient(build_app(engine, "m")) as client:
        body = {"prompt": [5, 9], "max_tokens": 8, "temperature": 0}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 500 and "injected failure" in r.json()["error"]["message"]
        assert client.get("/health").status_code == 200
        r = client.post("/v1/completions", json={**body, "return_token_ids": True})
        assert r.status_code == 200
        assert r.json()["choices"][0]["token_ids"] == reference_greedy(target, [5, 9], 8)
        assert not engine.scheduler.running and not engine.requests


def test_requests_over_the_queue_limit_get_429_at_once_and_nothing_leaks():
    """max_num_seqs=1 running + max_queued=1 waiting: with the engine held, a third request is
    answered 429 immediately (streaming or not); once released, the two finish exactly and the
    admission count, KV slots and engine requests all return to zero."""
    import threading
    import time

    target = make_target(0)
    opts = EngineOptions(target="<memory>", checkpoint="<memory>", dtype="float64", max_num_seqs=1)
    engine = Engine(target, make_draft(target), opts, eos_token_ids=[])
    gate, real_step = threading.Event(), engine.step
    engine.step = lambda: (gate.wait(30), real_step())[1]
    body = {"prompt": [5, 9], "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    with TestClient(build_app(engine, "m", max_queued=1)) as client:
        srv = client.app.state.server
        results = []
        held = [
            threading.Thread(
                target=lambda: results.append(client.post("/v1/completions", json=body))
            )
            for _ in range(2)
        ]
        for t in held:
            t.start()
        deadline = time.time() + 30
        while srv.admission.in_flight < 2:
            assert time.time() < deadline
            time.sleep(0.01)
        for stream in (False, True):
            t0 = time.perf_counter()
            r = client.post("/v1/completions", json={**body, "stream": stream})
            assert r.status_code == 429 and time.perf_counter() - t0 < 5
            err = r.json()["error"]
            assert err["type"] == "RateLimitError" and "max_queued=1" in err["message"]
        gate.set()
        for t in held:
            t.join(30)
        ref = reference_greedy(target, [5, 9], 8)
        assert [r.status_code for r in results] == [200, 200]
        assert all(r.json()["choices"][0]["token_ids"] == ref for r in results)
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200 and "[DONE]" in r.read().decode()
        m = scrape(client)
    assert srv.admission.in_flight == 0
    assert m["dspark:kv_slots_used"] == 0 and m["dspark:engine_requests"] == 0


def test_max_queued_must_not_be_negative():
    target = make_target(0)
    opts = EngineOptions(target="<memory>", checkpoint=None, dtype="float64")
    engine = Engine(target, None, opts, eos_token_ids=[])
    with pytest.raises(ValueError, match="max_queued=-1"):
        build_app(engine, "m", max_queued=-1)
