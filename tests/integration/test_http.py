"""The HTTP server as a real process: `python -m serve.api` on a free 127.0.0.1 port, real HTTP.

One server (module fixture) on a context-free tiny target with a draft tuned to it (greedy
drafts are always accepted). Every wait is bounded; the process is always killed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_engine_helpers import (
    make_draft,
    make_target,
    save_draft,
    save_target,
    wait_healthy,
)

REPO = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 1024
N = 4  # drafts per round (block_size 4, anchor-first)
STARTUP_TIMEOUT_S = 300  # model load on 2 busy cores can be slow
NAME = "tiny-dspark"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("http")
    target = make_target(0, predictable=True, sharpness=30.0)
    save_target(target, root / "target")
    save_draft(make_draft(target, True, None, tuned=True), root / "draft")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    log = open(root / "server.log", "w")  # noqa: SIM115 - closed in the finally below
    cmd = [
        sys.executable,
        "-m",
        "serve.api",
        "--target",
        str(root / "target"),
        "--checkpoint",
        str(root / "draft"),
        "--port",
        str(port),
        "--dtype",
        "float64",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "4",
        "--served-model-name",
        NAME,
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, [proc], lambda _: read_log(root), STARTUP_TIMEOUT_S, poll_s=0.5)
        yield {"base": base, "root": root, "target": target, "proc": proc}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


def read_log(root: Path) -> str:
    return (root / "server.log").read_text()[-4000:]


def reference(target, prompt_ids, n):
    torch.set_num_threads(1)
    from tests.unit.test_engine_helpers import reference_greedy

    return reference_greedy(target, prompt_ids, n)


def post(server, path, body, timeout=120.0, raw=None):
    return httpx.post(
        server["base"] + path,
        content=raw if raw is not None else json.dumps(body),
        headers={"content-type": "application/json"},
        timeout=timeout,
    )


def sse(server, path, body, timeout=120.0) -> list:
    """The `data:` payloads of a streamed response (the final "[DONE]" kept as a string)."""
    events = []
    with httpx.stream("POST", server["base"] + path, json=body, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def metrics(server) -> dict:
    text = httpx.get(server["base"] + "/metrics", timeout=30).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("" if "position" not in s.labels else f"[{s.labels['position']}]")
            out[key] = s.value
    return out


def wait_idle(server, timeout=60.0):
    deadline = time.monotonic() + timeout
    while metrics(server).get("vllm:num_requests_running", 0) > 0:
        assert time.monotonic() < deadline, "requests still running"
        time.sleep(0.2)


def ok_request(server):
    r = post(server, "/v1/completions", {"prompt": [5, 6], "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["text"].split()) >= 1


# ---------------------------------------------------------------------- basics
def test_health_and_models(server):
    assert httpx.get(server["base"] + "/health", timeout=10).status_code == 200
    body = httpx.get(server["base"] + "/v1/models", timeout=10).json()
    assert body["object"] == "list" and body["data"][0]["id"] == NAME
    assert body["data"][0]["max_model_len"] == MAX_MODEL_LEN


def test_completion_greedy_matches_target(server):
    prompt = [5, 7, 9, 11]
    body = {
        "model": NAME,
        "prompt": prompt,
        "max_tokens": 21,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert choice["token_ids"] == reference(server["target"], prompt, 21)
    assert choice["finish_reason"] == "length" and out["object"] == "text_completion"
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 21, "total_tokens": 25}
    # A text prompt goes through the tokenizer (word-level: "w{i}" is id i + 7).
    r = post(server, "/v1/completions", {**body, "prompt": "w0 w1 w2"})
    assert r.json()["choices"][0]["prompt_token_ids"] == [7, 8, 9]


def test_streaming_equals_non_streaming(server):
    body = {"prompt": [20, 21, 22], "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    full = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    events = sse(server, "/v1/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == full
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    # usage chunk on request
    events = sse(
        server,
        "/v1/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert events[-2]["usage"]["completion_tokens"] == 16 and events[-2]["choices"] == []


def test_chat_completion_and_stream(server):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(server["root"] / "target")
    messages = [{"role": "user", "content": "w3 w4 w5"}]
    body = {"model": NAME, "messages": messages, "max_tokens": 9, "temperature": 0}
    body |= {"ignore_eos": True, "return_token_ids": True}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok.encode(text, add_special_tokens=False)
    assert choice["prompt_token_ids"] == prompt_ids
    assert choice["token_ids"] == reference(server["target"], prompt_ids, 9)
    assert choice["message"]["role"] == "assistant"
    events = sse(server, "/v1/chat/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1])
    assert streamed == choice["message"]["content"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_concurrent_clients(server):
    prompts = [[30 + i, 40 + i, 50 + 2 * i][: 1 + i % 3] for i in range(7)]
    lengths = [5 + 3 * i for i in range(7)]

    def run(i):
        body = {
            "prompt": prompts[i],
            "max_tokens": lengths[i],
            "temperature": 0,
            "ignore_eos": True,
        }
        if i % 2:
            events = sse(
                server, "/v1/completions", {**body, "stream": True, "return_token_ids": True}
            )
            return [t for e in events[:-1] for t in e["choices"][0]["token_ids"]]
        r = post(server, "/v1/completions", {**body, "return_token_ids": True})
        return r.json()["choices"][0]["token_ids"]

    with ThreadPoolExecutor(7) as pool:
        results = list(pool.map(run, range(7)))
    for i in range(7):
        assert results[i] == reference(server["target"], prompts[i], lengths[i]), i


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "raw,body,status,needle",
    [
        (b"{not json", None, 400, "malformed JSON"),
        (b"[1, 2]", None, 400, "JSON object"),
        (None, {"model": "gpt-9", "prompt": [1], "max_tokens": 2}, 404, "does not exist"),
        (None, {"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens"),
        (None, {"prompt": [1, 2], "max_tokens": -3}, 400, "max_tokens"),
        (None, {"prompt": [1, 2], "max_tokens": MAX_MODEL_LEN}, 400, "maximum context length"),
        (None, {"prompt": [5] * (MAX_MODEL_LEN + 1), "max_tokens": 1}, 400, "context length"),
        (None, {"max_tokens": 3}, 400, "prompt"),
        (None, {"prompt": [1], "n": 2}, 400, "n=1"),
        (None, {"prompt": [1], "temperature": -1}, 400, "temperature"),
        (None, {"prompt": [100000], "max_tokens": 2}, 400, "token ids"),
    ],
)
def test_errors_are_openai_shaped_and_server_keeps_serving(server, raw, body, status, needle):
    r = post(server, "/v1/completions", body, raw=raw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["code"] == status and err["type"]
    ok_request(server)


def test_chat_errors(server):
    r = post(server, "/v1/chat/completions", {"messages": [], "max_tokens": 2})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = post(server, "/v1/chat/completions", {"model": "x", "messages": [{"role": "user"}]})
    assert r.status_code == 404
    ok_request(server)


# ---------------------------------------------------------------------- disconnects
def test_client_disconnect_aborts_only_its_request(server):
    wait_idle(server)
    m0 = metrics(server)
    before = m0.get("dspark:request_disconnected_total", 0)
    # A long sampled stream (partial acceptance, so it is still running when we leave).
    body = {
        "prompt": [60, 61],
        "max_tokens": MAX_MODEL_LEN - 2,
        "temperature": 1.0,
        "seed": 7,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server["base"] + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
    # ... and a non-streaming one abandoned by a client-side timeout.
    with pytest.raises(httpx.TimeoutException):
        post(server, "/v1/completions", {**body, "stream": False, "seed": 8}, timeout=0.5)
    ok_request(server)  # served while (or after) the abandoned ones are cleaned up
    deadline = time.monotonic() + 60
    while metrics(server).get("dspark:request_disconnected_total", 0) < before + 2:
        assert time.monotonic() < deadline, f"disconnects not seen:\n{read_log(server['root'])}"
        time.sleep(0.2)
    wait_idle(server)
    m1 = metrics(server)
    # Counted as disconnects only: not as aborts (server-side), not as successes.
    assert m1["dspark:request_disconnected_total"] == before + 2
    assert m1["dspark:request_aborted_total"] == m0["dspark:request_aborted_total"]
    assert server["proc"].poll() is None
    ok_request(server)


# ---------------------------------------------------------------------- metrics
def test_metrics_match_what_clients_received(server):
    wait_idle(server)
    m0 = metrics(server)
    # Greedy drafts of the tuned draft are always accepted: rounds emit N + 1 tokens, and
    # 1 + 3 (N + 1) tokens end exactly on a round boundary (no truncated round).
    max_tokens = 1 + 3 * (N + 1)
    rounds = accepted = 0
    for i in range(3):
        body = {
            "prompt": [10 + i, 20 + i],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        chunks = sse(server, "/v1/completions", body)[:-1]
        sizes = [len(c["choices"][0]["token_ids"]) for c in chunks]
        assert sizes[0] == 1 and sum(sizes) == max_tokens  # prefill token, then rounds
        rounds += len(sizes) - 1
        accepted += sum(s - 1 for s in sizes[1:])
    m1 = metrics(server)

    def d(k):
        return m1.get(k, 0) - m0.get(k, 0)

    assert d("vllm:spec_decode_num_drafts_total") == rounds
    assert d("vllm:spec_decode_num_accepted_tokens_total") == accepted == rounds * N
    assert d("vllm:spec_decode_num_draft_tokens_total") == rounds * N
    for k in range(N):
        assert d(f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{k}]") == rounds
    assert d("vllm:generation_tokens_total") == 3 * max_tokens
    assert d("vllm:request_success_total") == 3
    # pooled mean acceptance length over the whole run, as `vllm bench serve` computes it
    mal = (
        1
        + m1["vllm:spec_decode_num_accepted_tokens_total"] / m1["vllm:spec_decode_num_drafts_total"]
    )
    assert 1.0 <= mal <= 1 + N
