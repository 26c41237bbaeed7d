"""serve.bench against a fake OpenAI-compatible server (FastAPI + uvicorn in a thread on
127.0.0.1) that streams known tokens at known delays and serves known /metrics counters."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from serve import bench
from serve.bench import (
    DEFAULT_PROMPTS,
    RequestResult,
    parse_spec_decode_metrics,
    spec_decode_delta,
    summarize,
)
from serve.engine.stats import SpecDecodeStats

TOKENS_PER_REQUEST = 6
FIRST_DELAY, STEP_DELAY = 0.05, 0.01
# Per finished request the fake engine adds: 2 drafts of 4 tokens, 5 accepted, per position
# [2, 2, 1, 0]. Counters start non-zero and are split over two engines to test the deltas.
PER_REQUEST = dict(drafts=2, draft_tokens=8, accepted=5, per_pos=[2, 2, 1, 0])
START = dict(
    drafts=[70, 30], draft_tokens=[280, 120], accepted=[90, 40], per_pos=[[40, 30, 15, 5]] * 2
)


class FakeServer:
    def __init__(self, with_metrics: bool = True, send_usage: bool = True):
        self.requests: list[dict] = []
        self.finished = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.metrics_calls = 0
        app = FastAPI()

        @app.get("/v1/models")
        def models():
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        async def stream(body: dict, chat: bool):
            self.requests.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                for i in range(TOKENS_PER_REQUEST):
                    await asyncio.sleep(FIRST_DELAY if i == 0 else STEP_DELAY)
                    choice = (
                        {"index": 0, "delta": {"content": f"t{i} "}}
                        if chat
                        else {"index": 0, "text": f"t{i} "}
                    )
                    yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                if send_usage:
                    usage = {"prompt_tokens": 3, "completion_tokens": TOKENS_PER_REQUEST}
                    yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
                self.finished += 1
            finally:
                self.in_flight -= 1

        @app.post("/v1/completions")
        async def completions(body: dict):
            if body["model"] != "fake-model":
                return JSONResponse({"error": "unknown model"}, status_code=404)
            return StreamingResponse(stream(body, chat=False), media_type="text/event-stream")

        @app.post("/v1/chat/completions")
        async def chat(body: dict):
            return StreamingResponse(stream(body, chat=True), media_type="text/event-stream")

        if with_metrics:

            @app.get("/metrics")
            def metrics():
                self.metrics_calls += 1
                return PlainTextResponse(self.metrics_text())

        self.app = app

    def metrics_text(self) -> str:
        n = self.finished
        lines = [
            "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
            "# TYPE vllm:spec_decode_num_drafts counter",
        ]
        for e in range(2):
            k = n if e == 0 else 0  # engine 0 does the work
            lbl = f'engine="{e}",model_name="num_drafts-fake"'
            lines += [
                f"vllm:spec_decode_num_drafts_total{{{lbl}}} "
                f"{START['drafts'][e] + k * PER_REQUEST['drafts']}.0",
                f"vllm:spec_decode_num_drafts_created{{{lbl}}} 1.7e9",
                f"vllm:spec_decode_num_draft_tokens_total{{{lbl}}} "
                f"{START['draft_tokens'][e] + k * PER_REQUEST['draft_tokens']}.0",
                f"vllm:spec_decode_num_accepted_tokens_total{{{lbl}}} "
                f"{START['accepted'][e] + k * PER_REQUEST['accepted']}.0",
            ]
            for pos in range(4):
                v = START["per_pos"][e][pos] + k * PER_REQUEST["per_pos"][pos]
                lines.append(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lbl},position="{pos}"}}'
                    f" {v}.0"
                )
        lines.append('vllm:num_requests_running{engine="0"} 0.0')
        return "\n".join(lines) + "\n"


@pytest.fixture
def serve_fake():
    servers = []

    def start(**kw) -> tuple[FakeServer, str]:
        fake = FakeServer(**kw)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(fake.app, host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 10
        while not server.started:
            assert time.time() < deadline, "fake server did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return fake, f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def test_bench_end_to_end_numbers(serve_fake, tmp_path, capsys):
    fake, url = serve_fake()
    out = tmp_path / "bench.json"
    n, c = 10, 3
    rc = bench.main(
        [
            "--base-url",
            url,
            "--model",
            "fake-model",
            "--concurrency",
            str(c),
            "--num-prompts",
            str(n),
            "--max-tokens",
            "16",
            "--temperature",
            "0.5",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    s = json.loads(out.read_text())
    assert s["completed"] == n and s["failed"] == 0
    assert s["total_output_tokens"] == n * TOKENS_PER_REQUEST
    assert s["output_tokens_from_usage"] is True
    # Pooled over the run: 1 + 5n / 2n, per position [2, 2, 1, 0] / 2, 5n / 8n.
    sd = s["spec_decode"]
    assert sd["num_drafts"] == 2 * n and sd["num_draft_tokens"] == 8 * n
    assert sd["num_accepted_tokens"] == 5 * n
    assert sd["mean_acceptance_length"] == pytest.approx(3.5)
    assert sd["per_position_acceptance_rates"] == pytest.approx([1.0, 1.0, 0.5, 0.0])
    assert sd["acceptance_rate"] == pytest.approx(5 / 8)
    # Timing: the server sleeps 50 ms before the first token and 10 ms between tokens.
    assert FIRST_DELAY <= s["mean_ttft_ms"] / 1000 < 1.0
    assert FIRST_DELAY <= s["median_ttft_ms"] / 1000 < 1.0
    assert STEP_DELAY * 0.9 <= s["mean_tpot_ms"] / 1000 < 0.5
    assert s["output_token_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration_s"])
    assert s["request_throughput"] == pytest.approx(n / s["duration_s"])
    # Concurrency is honoured, and requests carry the fixed prompts in order.
    assert 2 <= fake.max_in_flight <= c
    assert sorted(r["prompt"] for r in fake.requests) == sorted(
        DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(n)
    )
    assert all(
        r["stream"] and r["max_tokens"] == 16 and r["temperature"] == 0.5 for r in fake.requests
    )
    table = capsys.readouterr().out
    for label in (
        "Request throughput",
        "Output token throughput",
        "Mean TTFT",
        "Median TTFT",
        "Mean TPOT",
        "Median TPOT",
        "Mean acceptance length:",
        "position 3:",
    ):
        assert label in table
    assert "3.50" in table


def test_bench_chat_no_usage_no_metrics(serve_fake, tmp_path, capsys):
    fake, url = serve_fake(with_metrics=False, send_usage=False)
    out = tmp_path / "b.json"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "alpha"}\n"beta"\n')
    rc = bench.main(
        [
            "--base-url",
            url + "/v1",
            "--concurrency",
            "2",
            "--num-prompts",
            "3",
            "--api",
            "chat",
            "--prompts",
            str(prompts),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    s = json.loads(out.read_text())
    assert s["config"]["model"] == "fake-model"  # from /v1/models
    assert s["total_output_tokens"] == 3 * TOKENS_PER_REQUEST  # counted by chunks
    assert s["output_tokens_from_usage"] is False
    assert s["spec_decode"] is None
    assert [r["messages"][0]["content"] for r in fake.requests].count("alpha") == 2
    assert "no vllm:spec_decode_* counters" in capsys.readouterr().out


def test_bench_reports_failures(serve_fake, tmp_path):
    _, url = serve_fake()
    out = tmp_path / "b.json"
    rc = bench.main(
        ["--base-url", url, "--model", "nope", "--num-prompts", "2", "--json", str(out)]
    )
    s = json.loads(out.read_text())
    assert rc == 1 and s["completed"] == 0 and s["failed"] == 2
    assert "HTTP 404" in s["errors"][0]


def test_parse_metrics_sums_engines_and_skips_created():
    fake = FakeServer()
    fake.finished = 3
    c = parse_spec_decode_metrics(fake.metrics_text())
    assert c.num_drafts == 100 + 6 and c.num_draft_tokens == 400 + 24
    assert c.num_accepted_tokens == 130 + 15
    assert c.num_accepted_tokens_per_pos == [86, 66, 33, 10]
    assert c.num_verified_draft_tokens is None  # vLLM exports no verified count
    # Our engine does (its own name): summed over label sets like the rest.
    ours = fake.metrics_text() + "".join(
        f'dspark:spec_decode_num_verified_draft_tokens_total{{engine="{e}"}} {v}.0\n'
        for e, v in enumerate((300, 20))
    )
    c = parse_spec_decode_metrics(ours)
    assert c.num_verified_draft_tokens == 320 and c.num_draft_tokens == 424
    assert parse_spec_decode_metrics('vllm:num_requests_running{engine="0"} 1.0\n') is None
    assert parse_spec_decode_metrics("dspark:spec_decode_num_verified_draft_tokens 3\n") is None
    # Counters without the _total suffix (a plain exporter) are read too.
    c = parse_spec_decode_metrics(
        "vllm:spec_decode_num_drafts 4\nvllm:spec_decode_num_accepted_tokens_per_pos"
        '{position="1",x="a,b=\\"c\\""} 3\n'
    )
    assert c.num_drafts == 4 and c.num_accepted_tokens_per_pos == [0, 3]


def test_spec_decode_delta_formulas():
    before = SpecDecodeStats(4, 10, 40, 20, [8, 6, 4, 2])
    after = SpecDecodeStats(4, 30, 120, 50, [22, 15, 9, 4])
    d = spec_decode_delta(before, after)
    assert d["num_drafts"] == 20 and d["num_accepted_tokens"] == 30
    assert d["mean_acceptance_length"] == pytest.approx(1 + 30 / 20)
    assert d["acceptance_rate"] == pytest.approx(30 / 80)
    assert d["num_verified_draft_tokens"] is None
    before.num_verified_draft_tokens, after.num_verified_draft_tokens = 25, 75
    assert spec_decode_delta(before, after)["num_verified_draft_tokens"] == 50
    assert spec_decode_delta(before, after)["acceptance_rate"] == pytest.approx(30 / 80)
    assert d["per_position_acceptance_rates"] == pytest.approx([14 / 20, 9 / 20, 5 / 20, 2 / 20])
    # Pooled equals the sum of the per-position rates plus one.
    assert d["mean_acceptance_length"] == pytest.approx(1 + sum(d["per_position_acceptance_rates"]))
    assert spec_decode_delta(None, after) is None
    idle = spec_decode_delta(after, after)
    assert idle["mean_acceptance_length"] is None and idle["per_position_acceptance_rates"] == []
    # A first scrape before any per-position sample: the missing positions count as zero.
    d = spec_decode_delta(parse_spec_decode_metrics("vllm:spec_decode_num_drafts_total 0\n"), after)
    assert d["accepted_per_pos"] == [22, 15, 9, 4] and d["mean_acceptance_length"] == 1 + 50 / 30


def test_summarize_exact():
    results = [
        RequestResult(0, True, latency_s=1.0, ttft_s=0.2, output_tokens=5),  # tpot 0.2
        RequestResult(1, True, latency_s=0.5, ttft_s=0.1, output_tokens=3),  # tpot 0.2
        RequestResult(2, True, latency_s=0.4, ttft_s=0.4, output_tokens=1),  # no tpot
        RequestResult(3, False, error="HTTP 500: boom"),
    ]
    s = summarize(results, duration_s=2.0)
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["total_output_tokens"] == 9
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_token_throughput"] == pytest.approx(4.5)
    assert s["mean_ttft_ms"] == pytest.approx(700 / 3)
    assert s["median_ttft_ms"] == pytest.approx(200)
    assert s["mean_tpot_ms"] == pytest.approx(200) and s["median_tpot_ms"] == pytest.approx(200)
    assert s["errors"] == ["HTTP 500: boom"]
    # Each successful request's own figures, by index (the failed one has none).
    got = [(r["index"], r["output_tokens"], r["ttft_ms"], r["tpot_ms"]) for r in s["requests"]]
    assert got == [
        (0, 5, pytest.approx(200), pytest.approx(200)),
        (1, 3, pytest.approx(100), pytest.approx(200)),
        (2, 1, pytest.approx(400), None),
    ]


def test_prompts_are_fixed_and_loadable(tmp_path):
    assert bench.load_prompts(None) == list(DEFAULT_PROMPTS)
    assert len(DEFAULT_PROMPTS) == len(set(DEFAULT_PROMPTS)) >= 16
    assert any("def " in p or "class " in p for p in DEFAULT_PROMPTS)
    txt = tmp_path / "p.txt"
    txt.write_text("one\n\ntwo\n")
    assert bench.load_prompts(str(txt)) == ["one", "two"]
    js = tmp_path / "p.json"
    js.write_text('["a", {"prompt": "b"}]')
    assert bench.load_prompts(str(js)) == ["a", "b"]
    assert bench.split_base_url("http://h:1/v1/") == ("http://h:1", "http://h:1/v1")
