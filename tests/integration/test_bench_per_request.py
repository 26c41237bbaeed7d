"""Each response's own acceptance (`metrics.speculative_decoding`, vLLM's shape) from our server,
and serve.bench's pooled figure and interval over requests, against the engine's /metrics
counters: two independent countings of the same rounds must agree exactly."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from serve import bench
from serve.api import build_app
from serve.engine import Engine, EngineOptions
from tests.integration.test_http_counters import WAIT_S, served
from tests.unit.test_engine_helpers import make_draft, make_target, make_tokenizer

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def app():
    target = make_target(0, predictable=True, sharpness=30.0)
    draft = make_draft(target, True, None, tuned=True)
    opts = EngineOptions(target="<m>", checkpoint="<m>", dtype="float64", max_num_seqs=4)
    return build_app(Engine(target, draft, opts, make_tokenizer(), []), "m")


def test_bench_pools_the_servers_own_per_request_acceptance(app):
    prompts = [" ".join(f"w{(7 * i + j) % 40 + 5}" for j in range(3 + i % 4)) for i in range(12)]
    with served(app) as (base, _):
        s = asyncio.run(
            bench.run_benchmark(
                base,
                "m",
                prompts,
                concurrency=4,
                num_prompts=12,
                max_tokens=24,
                temperature=0.0,
                extra_body={"ignore_eos": True},
                timeout_s=WAIT_S,
            )
        )
        plain = httpx.post(
            base + "/v1/completions",
            json={"prompt": prompts[0], "max_tokens": 24, "temperature": 0, "ignore_eos": True},
            timeout=WAIT_S,
        ).json()
    assert s["completed"] == 12 and s["failed"] == 0
    reqs = s["requests"]
    assert all(r["spec_rounds"] > 0 for r in reqs)
    sd = s["spec_decode"]  # the engine's counters, scraped from /metrics before and after
    assert sum(r["spec_rounds"] for r in reqs) == sd["num_drafts"]
    assert sum(r["spec_accepted"] for r in reqs) == sd["num_accepted_tokens"]
    pr = s["per_request_acceptance"]
    assert pr["requests"] == 12
    assert pr["mean_acceptance_length"] == pytest.approx(sd["mean_acceptance_length"], abs=1e-12)
    low, high = pr["ci95"]
    assert low <= pr["mean_acceptance_length"] <= high
    assert sd["mean_acceptance_length"] > 1.5  # a tuned draft: the counts are not trivial
    # the non-streaming response carries the same figures for the same prompt (T=0)
    spec = plain["metrics"]["speculative_decoding"]
    assert spec["num_spec_steps"] == reqs[0]["spec_rounds"]
    assert spec["num_accepted_draft_tokens"] == reqs[0]["spec_accepted"]
    assert (
        spec["mean_acceptance_length"]
        == 1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
    )
    assert "Mean acceptance length, by request:" in bench.format_table(s)
