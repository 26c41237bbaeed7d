"""lab/gpu/summarize_qwen25.py on a run folder of serve.bench outputs (written by serve.bench's own
`summarize` from known requests) and an engine eval.json: each goal key against arithmetic done
here by hand."""

import json

import pytest

from lab.gpu import summarize_qwen25 as sq
from serve.bench import RequestResult, summarize


def bench_json(tpot_s: float, n: int = 6, rounds=None, tau=None) -> dict:
    """A serve.bench JSON of n requests of 11 tokens, each with TTFT 0.1 s and the given TPOT;
    `rounds` [(rounds, accepted)] per request: the server's own acceptance."""
    results = []
    for i in range(n):
        r = RequestResult(i, True, latency_s=0.1 + 10 * tpot_s, ttft_s=0.1, output_tokens=11)
        if rounds:
            r.spec_rounds, r.spec_accepted = rounds[i % len(rounds)]
        results.append(r)
    s = summarize(results, 1.0)
    s["spec_decode"] = {"mean_acceptance_length": tau} if tau else None
    return s


def write(run, rel, obj):
    path = run / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def test_goal_keys_from_a_run_folder(tmp_path):
    run = tmp_path / "run1"
    write(
        run,
        "serve/tau_dspark_code_t0.json",
        bench_json(0.002, rounds=[(10, 30), (20, 50)], tau=3.6),
    )
    write(run, "serve/tau_dspark_chat_t0.json", bench_json(0.002, tau=2.5))
    write(run, "serve/tau_dspark_code_first_t0.json", bench_json(0.002, tau=3.3))
    write(run, "serve/tau_dspark_chat_first_t0.json", bench_json(0.002, tau=2.4))
    tpot = {"target_only": 0.006, "dspark": 0.002, "dspark_adaptive": 0.0025}
    for c in sq.LEVELS:
        for v, t in tpot.items():
            t = 0.0016 if (v, c) == ("dspark_adaptive", 128) else t  # adaptive wins at 128 only
            write(run, f"serve/vllm_{v}_c{c}.json", bench_json(t))
    rows = [
        {"temperature": 0.0, "domain": "code", "mean_acceptance_length": 3.0},
        {"temperature": 0.0, "domain": "chat", "mean_acceptance_length": 2.5},
        {"temperature": 1.0, "domain": "code", "mean_acceptance_length": 9.0},  # not compared
    ]
    write(run, "recipe/evaluate/test/eval.json", {"rows": rows})
    pair = [
        {"draft": "dflash", "temperature": 0.0, "domain": "code"},
        {
            "draft": "dspark",
            "temperature": 0.0,
            "domain": "code",
            "vs_first": {"value": 1.2, "low": 1.1, "high": 1.3},
        },
        {
            "draft": "dspark",
            "temperature": 1.0,
            "domain": "chat",
            "vs_first": {"value": 0.9, "low": 0.8, "high": 1.0},
        },
    ]
    write(run, "dspark_vs_dflash/eval.json", {"rows": pair})
    write(run, "serve/serve_dspark.log", "INFO Initializing a V1 LLM engine (v0.34.0) with config")
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"kind": "measured", "train_mfu": 0.3, "train_mfu_source": "x"}))
    assert sq.main([str(run), "--summary", str(summary), "--device", "H100"]) == 0
    s = json.loads(summary.read_text())
    assert s["train_mfu"] == 0.3  # kept
    assert (
        s["tau_t0_code"] == 3.6 and s["tau_t0_code_source"] == "run1/serve/tau_dspark_code_t0.json"
    )
    lo, hi = s["tau_t0_code_ci95"]  # pooled per-request figure: 1 + 80 / 30 over 6 requests
    assert lo <= 1 + 80 / 30 <= hi and lo < hi
    assert "tau_t0_chat_ci95" not in s and "tau_t1_code" not in s  # no per-request data; no run
    assert s["speedup_c8"] == pytest.approx(3.0) and s["speedup_c8_variant"] == "dspark"
    assert s["speedup_c128"] == pytest.approx(0.006 / 0.0016)
    assert s["speedup_c128_variant"] == "dspark_adaptive"
    assert s["speedup_c8_ci95"] == pytest.approx([3.0, 3.0])  # identical requests
    assert s["adaptive_over_plain_min"] == pytest.approx(0.8)
    assert s["adaptive_over_plain_min_concurrency"] == 1
    assert s["vllm_vs_engine_accept_rel_diff"] == pytest.approx(0.1)  # code: 0.3 / 3.0
    assert s["dspark_over_dflash_t0_code"] == 1.2 and s["dspark_over_dflash_t0_code_ci95"] == [
        1.1,
        1.3,
    ]
    assert s["dspark_over_dflash_t1_chat"] == 0.9
    assert s["vllm_version"] == "0.34.0" and s["tau_t0_code_device"] == "H100"
