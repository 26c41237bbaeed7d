"""The acceptance watchdog: its binomial rule against a naive reference, its window, the embedded
server with a matching and a mismatched draft, and the vLLM sidecar's /metrics parsing."""

from __future__ import annotations

import json
import logging
import math
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from common.checkpoint import load_checkpoint, save_checkpoint
from common.config import DSparkConfig
from common.contract import check_checkpoint
from common.model import DSparkDraftModel
from serve.api import build_app
from serve.engine import Engine, EngineOptions, SamplingParams, SpecDecodeStats
from serve.watchdog import (
    AcceptanceWatchdog,
    WatchdogRule,
    binom_cdf,
    expected_acceptance,
    poll,
    spec_stats_from_metrics,
)
from tests.unit.test_engine_helpers import MASK, make_draft, make_target

pytestmark = pytest.mark.usefixtures("torch_single_thread")
MAX_REQUESTS = 200


def test_binom_cdf_matches_a_naive_float64_sum():
    for n, p in [(10, 0.3), (200, 0.05), (256, 0.5), (1000, 0.15)]:
        for x in (0, 1, n // 10, n // 3, n - 1, n):
            naive = sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(x + 1))
            assert binom_cdf(x, n, p) == pytest.approx(min(naive, 1.0), rel=1e-9, abs=1e-300)


def _counters(rate0: float, drafts: int, rng: random.Random, base=None) -> SpecDecodeStats:
    s = base.copy() if base else SpecDecodeStats(2)
    hits = sum(rng.random() < rate0 for _ in range(drafts))
    s.num_drafts += drafts
    s.num_draft_tokens += 2 * drafts
    s.num_accepted_tokens_per_pos[0] += hits
    s.num_accepted_tokens_per_pos[1] += hits // 2
    s.num_accepted_tokens += hits + hits // 2
    return s


@pytest.mark.parametrize("expected0", [0.9, 0.3, 0.08])
def test_rule_fires_on_collapse_and_not_at_the_recorded_rate(expected0):
    rng = random.Random(0)
    rule = WatchdogRule(window_drafts=256)
    # At the recorded rate: 400 verdicts over 100k drafts, never an alarm.
    dog, s = AcceptanceWatchdog([expected0, 0.5], rule), None
    for _ in range(400):
        s = _counters(expected0, 250, rng, s)
        assert not dog.observe(s).alarm
    assert dog.reading.drafts >= 256
    # Collapsed to a fifth: an alarm, but only once the window holds 256 drafts.
    dog, s = AcceptanceWatchdog([expected0, 0.5], rule), None
    s = _counters(expected0 / 5, 200, rng)
    assert dog.observe(s).drafts == 0 and not dog.reading.alarm  # no verdict yet
    s = _counters(expected0 / 5, 100, rng, s)
    assert dog.observe(s).alarm and dog.reading.drafts == 300


def test_window_follows_the_recent_drafts():
    rng = random.Random(1)
    dog, s = AcceptanceWatchdog([0.8, 0.5], WatchdogRule(window_drafts=256)), None
    for _ in range(10):
        s = _counters(0.8, 100, rng, s)
        dog.observe(s)
    for _ in range(3):  # the draft breaks: the pooled-since-start rate would still look fine
        s = _counters(0.0, 100, rng, s)
        dog.observe(s)
    assert dog.reading.alarm and dog.reading.drafts == 300 and dog.reading.realized[0] == 0.0
    for _ in range(3):  # and recovers: the alarm clears once the window has moved on
        s = _counters(0.8, 100, rng, s)
        dog.observe(s)
    assert not dog.reading.alarm


# ---------------------------------------------------------------- the embedded server


def _prompts(seed: int, n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=g).tolist()
    return [torch.randint(7, 96, (k,), generator=g).tolist() for k in lengths]


def _engine(target, draft, ckpt=None) -> Engine:
    opts = EngineOptions(
        target="<memory>",
        checkpoint=str(ckpt) if ckpt else "<memory>",
        dtype="float64",
        max_num_seqs=4,
        max_model_len=96,
    )
    return Engine(target, draft, opts, eos_token_ids=[])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A predictable target, its draft (a weakly tuned Markov head: ~0.3 at position 0) and that
    draft's acceptance measured on held-out prompts, recorded as training records it."""
    target = make_target(0, predictable=True)
    draft = make_draft(target, True, None, tuned=True, strength=0.2)
    held_out = _engine(target, draft)
    ps = _prompts(1, 40)
    held_out.generate(ps, [SamplingParams(max_tokens=16) for _ in ps])
    recorded = held_out.stats.spec.conditional_acceptance()
    ckpt = tmp_path_factory.mktemp("ckpt")
    prov = {"expected_acceptance": {"per_position": recorded, "source": "held-out evaluation"}}
    (ckpt / "provenance.json").write_text(json.dumps(prov))
    # The same draft trained against another revision of the target: loads fine, drafts wrong.
    other = make_draft(make_target(1, predictable=True), True, None, tuned=True, strength=0.2)
    return target, draft, other, ckpt, recorded


def _gauges(client) -> dict:
    out = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            if s.name.startswith("dspark:acceptance_watchdog"):
                pos = s.labels.get("position")
                out[s.name if pos is None else f"{s.name}[{pos}]"] = s.value
    return out


def _serve_until_alarm(target, draft, ckpt) -> tuple[int | None, dict]:
    """Send up to MAX_REQUESTS greedy requests (4 at a time); scrape /metrics after each batch.
    -> (requests sent when the alarm was first seen, or None; the last gauges)."""
    prompts = _prompts(2, MAX_REQUESTS)
    with TestClient(build_app(_engine(target, draft, ckpt), "m")) as client:

        def one(p):
            body = {"prompt": p, "max_tokens": 16, "temperature": 0.0}  # greedy
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text

        sent, gauges = 0, {}
        with ThreadPoolExecutor(4) as pool:
            while sent < MAX_REQUESTS:
                list(pool.map(one, prompts[sent : sent + 4]))
                sent += 4
                gauges = _gauges(client)
                if gauges["dspark:acceptance_watchdog_alarm"] == 1.0:
                    return sent, gauges
    return None, gauges


def test_matching_draft_never_fires(served, caplog):
    target, draft, _, ckpt, recorded = served
    assert 0.15 < recorded[0] < 0.6  # an intermediate rate: the test has room either way
    with caplog.at_level(logging.WARNING, logger="serve.watchdog"):
        fired_at, gauges = _serve_until_alarm(target, draft, ckpt)
    assert fired_at is None and "ALARM" not in caplog.text
    assert gauges["dspark:acceptance_watchdog_window_drafts"] >= 256  # verdicts were made
    assert gauges["dspark:acceptance_watchdog_expected[0]"] == pytest.approx(recorded[0])
    assert abs(gauges["dspark:acceptance_watchdog_realized[0]"] - recorded[0]) < 0.1


def test_mismatched_draft_fires_within_200_requests(served, caplog):
    target, _, other, ckpt, recorded = served
    with caplog.at_level(logging.WARNING, logger="serve.watchdog"):
        fired_at, gauges = _serve_until_alarm(target, other, ckpt)
    assert fired_at is not None and fired_at <= MAX_REQUESTS
    assert gauges["dspark:acceptance_watchdog_realized[0]"] < recorded[0] / 5
    assert "acceptance watchdog ALARM" in caplog.text and "serve.check" in caplog.text


def anchor_slot_draft(target) -> DSparkDraftModel:
    """What anchor-first training teaches a draft on a predictable target: the slot holding the
    anchor x_p drafts x_{p+1} = f(x_p). Built, not trained: its layers are the target's own MLPs
    and norms with the attention silenced (so is the target's), so each slot computes the target's
    next-token function of the token in it. Mask slots draft the constant f(MASK); no Markov
    bias."""
    tc = target.config
    cfg = DSparkConfig.from_target(
        tc,
        mask_token_id=MASK,
        num_hidden_layers=tc.num_hidden_layers,
        block_size=4,
        markov_rank=8,
        intermediate_size=tc.intermediate_size,
        head_dim=8,
        sample_from_anchor=True,
        target_layer_ids=[0, 2],
        enable_confidence_head=False,
    )
    draft = DSparkDraftModel(cfg).to(torch.float64)
    draft.init_from_target(target.get_input_embeddings().weight, target.lm_head.weight)
    with torch.no_grad():
        for mine, theirs in zip(draft.layers, target.model.layers, strict=True):
            mine.self_attn.o_proj.weight.zero_()
            mine.mlp.load_state_dict(theirs.mlp.state_dict())
            mine.post_attention_layernorm.weight.copy_(theirs.post_attention_layernorm.weight)
        draft.norm.weight.copy_(target.model.norm.weight)
        draft.markov_head.markov_w2.weight.zero_()
    return draft.eval()


def _acceptance(target, draft, prompts) -> list[float]:
    engine = _engine(target, draft)
    engine.generate(prompts, [SamplingParams(max_tokens=16) for _ in prompts])
    return engine.stats.spec.conditional_acceptance()


@pytest.fixture(scope="module")
def wrong_layout(tmp_path_factory):
    """The anchor-first draft exported with its held-out acceptance, and the same export with its
    layout keys flipped to 1+N (sample_from_anchor false, dspark_bonus_anchor true, N = B-1).
    Served so, draft 0 is read from the first mask slot instead of the anchor slot."""
    target = make_target(0, predictable=True)
    draft = anchor_slot_draft(target)
    recorded = _acceptance(target, draft, _prompts(1, 40))
    prov = {"expected_acceptance": {"per_position": recorded, "source": "held-out evaluation"}}
    kw = {"dtype": torch.float32, "include_embed": True, "include_lm_head": True}
    right = save_checkpoint(draft, tmp_path_factory.mktemp("right") / "d", provenance=prov, **kw)
    flipped = save_checkpoint(draft, tmp_path_factory.mktemp("flip") / "d", provenance=prov, **kw)
    cfg = json.loads((flipped / "config.json").read_text())
    assert (cfg["sample_from_anchor"], cfg["dspark_bonus_anchor"]) == (True, False)
    cfg["sample_from_anchor"], cfg["dspark_bonus_anchor"] = False, True
    cfg["num_speculative_tokens"] = cfg["block_size"] - 1  # consistently, as 1+N drafts B-1
    (flipped / "config.json").write_text(json.dumps(cfg))
    return target, right, flipped, recorded


def test_wrong_layout_draft_fires_within_200_requests(wrong_layout, caplog):
    target, right, flipped, recorded = wrong_layout
    assert recorded[0] > 0.95  # the anchor slot drafts the target's own greedy token
    # Control: the export as trained (float32 weights, loaded back) accepts as recorded.
    as_trained = load_checkpoint(right, dtype=torch.float64)
    assert _acceptance(target, as_trained, _prompts(2, 40))[0] > 0.95
    # The static check refuses the flip while provenance records the trained layout; a checkpoint
    # whose provenance lost it (re-saved by another tool) passes, and only the watchdog can tell.
    assert any("sample_from_anchor" in m for m in check_checkpoint(flipped))
    prov = json.loads((flipped / "provenance.json").read_text())
    del prov["dspark_config"]
    (flipped / "provenance.json").write_text(json.dumps(prov))
    assert check_checkpoint(flipped) == []
    served = load_checkpoint(flipped, dtype=torch.float64)
    assert served.config.num_speculative_tokens == 3  # loads and serves without an error
    with caplog.at_level(logging.WARNING, logger="serve.watchdog"):
        fired_at, gauges = _serve_until_alarm(target, served, flipped)
    assert fired_at is not None and fired_at <= MAX_REQUESTS
    assert gauges["dspark:acceptance_watchdog_realized[0]"] < recorded[0] / 5
    assert "acceptance watchdog ALARM" in caplog.text


def test_no_recorded_acceptance_means_no_watchdog(served, tmp_path):
    target, draft, _, _, _ = served
    assert expected_acceptance(tmp_path) is None
    with TestClient(build_app(_engine(target, draft, tmp_path), "m")) as client:
        assert _gauges(client) == {}


# ---------------------------------------------------------------- the vLLM sidecar


VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 300.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 900.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 0.0
"""


def test_sidecar_reads_vllm_counters_and_applies_the_rule(monkeypatch):
    s = spec_stats_from_metrics(VLLM_METRICS)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (300, 900, 12)
    assert s.num_accepted_tokens_per_pos == [9, 3, 0]
    assert s.num_verified_draft_tokens is None  # vLLM exports no verified count
    assert spec_stats_from_metrics("# nothing\n") is None

    class Page:
        def __init__(self, text):
            self.text = text

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def read(self):
            return self.text.encode()

    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout: Page(VLLM_METRICS))
    monkeypatch.setattr("time.sleep", lambda s: None)
    bad = poll("http://x/metrics", AcceptanceWatchdog([0.6, 0.5, 0.4]), 0.0, max_polls=2)
    assert bad.alarm and bad.drafts == 300 and bad.realized[0] == pytest.approx(0.03)
    good = poll("http://x/metrics", AcceptanceWatchdog([0.05, 0.5, 0.4]), 0.0, max_polls=2)
    assert not good.alarm and good.drafts == 300


def test_sidecar_parser_reads_prometheus_clients_own_exposition(served):
    """vLLM and the embedded server render counters with the same library: parse a real page."""
    target, draft, _, _, _ = served
    engine = _engine(target, draft)
    with TestClient(build_app(engine, "m")) as client:
        r = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 10})
        assert r.status_code == 200
        parsed = spec_stats_from_metrics(client.get("/metrics").text)
    assert parsed == engine.stats.spec and parsed.num_drafts > 0


def test_launch_with_vllm_starts_the_sidecar_before_exec(tmp_path, monkeypatch, capsys):
    import os

    from common.checkpoint import save_checkpoint
    from serve import launch, watchdog
    from tests.conftest import tiny_model

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    prov = {"expected_acceptance": {"per_position": [0.7, 0.5, 0.4, 0.3], "source": "held-out"}}
    ckpt = save_checkpoint(tiny_model(num_hidden_layers=1), tmp_path / "d", provenance=prov)
    bare = save_checkpoint(tiny_model(num_hidden_layers=1), tmp_path / "bare")
    events = []
    monkeypatch.setattr(launch, "probe_vllm_version", lambda: "0.34.0")
    monkeypatch.setattr(launch, "probe_cuda_devices", lambda: 1)
    monkeypatch.setattr(launch, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(launch, "exec_command", lambda cmd: events.append(("exec", cmd)))
    monkeypatch.setattr(launch, "check_port_free", lambda host, port: None)
    monkeypatch.setattr(
        watchdog.subprocess, "Popen", lambda cmd, **kw: events.append(("sidecar", cmd)) or 1
    )
    argv = [f"target={target}", f"checkpoint={ckpt}", "engine=vllm", "port=8123"]
    assert launch.main(argv) == 0
    assert [e[0] for e in events] == ["sidecar", "exec"]
    cmd = events[0][1]
    assert cmd[1:3] == ["-m", "serve.watchdog"]
    assert cmd[cmd.index("--metrics-url") + 1] == "http://127.0.0.1:8123/metrics"
    assert cmd[cmd.index("--parent-pid") + 1] == str(os.getpid())  # exec keeps the pid
    assert "acceptance watchdog: sidecar" in capsys.readouterr().out
    # Without recorded acceptance there is nothing to watch: no sidecar, vLLM still starts.
    events.clear()
    assert launch.main([f"target={target}", f"checkpoint={bare}", "engine=vllm"]) == 0
    assert [e[0] for e in events] == ["exec"]
