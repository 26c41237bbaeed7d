"""The CPU-testable parts of the vLLM round-cost benchmark and the adaptive-verification
emulation: folders our exporter writes, the decode-window timing, the speed-up arithmetic, the
cost model and the acceptance model (vLLM itself runs only on the GPU machine)."""

import json

import pytest
import torch

from common.checkpoint import read_config
from common.contract import check_checkpoint
from common.sampling.adaptive import SPSTable
from lab.gpu import adaptive_emulation as ae
from lab.gpu import vllm_round_cost as vrc

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def test_folders_are_valid_checkpoints_with_k_speculative_tokens(tmp_path):
    target = vrc.build_target_dir("tiny", tmp_path)
    assert json.loads((target / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    dirs = vrc.build_draft_dirs("tiny", target, tmp_path, [7, 3, 1], ["v32k"])
    assert set(dirs) == {"dspark_v32k_k7", "dspark_v32k_k3", "dspark_v32k_k1", "profile"}
    for name, d in dirs.items():
        assert check_checkpoint(d) == [], name
        k = vrc.parse_config(name)[1]
        cfg = read_config(d)
        assert cfg.num_speculative_tokens == k and cfg.reduced_vocab
        assert cfg.num_hidden_layers == 5 and cfg.markov_rank == 256
    assert not read_config(dirs["dspark_v32k_k1"]).sample_from_anchor  # block 2, 1+N layout


def test_decode_window_excludes_prefill_and_the_tail():
    # 2 requests: step 0 prefills request a, step 1 request b, then 3 decode steps of 2 tokens
    # each; request a finishes at step 5.
    steps = [
        (0.5, {"a": (1, False)}),
        (0.4, {"b": (1, False)}),
        (0.01, {"a": (3, False), "b": (3, False)}),
        (0.02, {"a": (5, False), "b": (5, False)}),
        (0.03, {"a": (7, False), "b": (6, False)}),
        (0.01, {"a": (8, True), "b": (8, False)}),
        (0.01, {"b": (9, True)}),
    ]
    durs, per_req, idx = vrc.decode_window(steps, 2, with_index=True)
    assert durs == [0.01, 0.02, 0.03] and idx == [2, 3, 4]
    assert per_req == [2.0, 2.0, 1.5]


def synthetic_results(draft_ms=1.5):
    def tv(m):  # a forward over m tokens: fixed cost + per token
        return 5.5 + 0.012 * m

    cfgs = {
        "target": {
            "decode": {str(b): {"median_ms": tv(b)} for b in (1, 8, 128)},
            "forward_ms_by_tokens": {str(m): tv(m) for m in (1, 8, 64, 128, 512, 1024, 2048)},
        }
    }
    for k in (1, 3, 7):
        cfgs[f"dspark_v32k_k{k}"] = {
            "vocab": "v32k",
            "k": k,
            "decode": {str(b): {"median_ms": tv(b * (k + 1)) + draft_ms} for b in (1, 8, 128)},
        }
    return {"args": {"shape": "qwen3_8b"}, "configs": cfgs}


def test_speedup_rows_and_sps_table():
    res = synthetic_results()
    rows = {(r["config"], r["batch"]): r for r in vrc.speedup_rows(res)}
    r = rows[("dspark_v32k_k7", 128)]
    ratio = (5.5 + 0.012 * 1024 + 1.5) / (5.5 + 0.012 * 128)
    assert r["round_over_step"] == pytest.approx(ratio)
    assert r["speedup_by_tau"]["4"] == pytest.approx(4 / ratio)
    assert set(rows[("dspark_v32k_k3", 1)]["speedup_by_tau"]) == {"1", "2", "3", "4"}
    table = vrc.sps_table(res)
    assert float(table(1024)) == pytest.approx(1e3 / (5.5 + 0.012 * 1024))
    assert isinstance(table, SPSTable) and table.meta["shape"] == "qwen3_8b"


def test_cost_model_recovers_the_draft_cost():
    cost = ae.CostModel.from_results(synthetic_results(draft_ms=1.5))
    assert cost.t_draft(128) == pytest.approx(1.5e-3)
    assert cost.t_step[8] == pytest.approx((5.5 + 0.012 * 8) / 1e3)
    assert float(1 / cost.round_table(8)(64)) == pytest.approx(1.5e-3 + cost.t_verify(64))


def test_a_prefill_priced_verify_dearer_than_the_round_keeps_the_model_exact():
    """At batch 1 a prefill step of 8 tokens cost more than a whole decode round (7.6 vs 7.06 ms,
    2026-12-05): t_draft goes negative instead of 0, so verifying all 7 costs t_round(1, 7)."""
    res = synthetic_results(draft_ms=-0.5)
    cost = ae.CostModel.from_results(res)
    assert cost.t_draft(1) < 0
    assert cost.t_adaptive(1, 8) == pytest.approx(cost.t_round[(1, 7)])
    check = {(c["batch"], c["k"]): c for c in ae.model_check(cost)}
    assert check[(1, 3)]["model_over_measured"] == pytest.approx(1.0, rel=1e-3)  # table interp.

    class Args:
        draws, spread, conf_noise = 2, 1.0, 0.0

    for c in res["configs"].values():  # flat verify cost, dearer than a round
        for d in c["decode"].values():
            d["median_ms"] = 6.0 + (1.0 if "k" in c else 0.0)
    res["configs"]["target"]["forward_ms_by_tokens"] = {str(m): 7.5 for m in (1, 2048)}
    r = ae.emulate(ae.CostModel.from_results(res), 1, 3.0, Args)
    assert r["adaptive_round_sps"] == pytest.approx(r["plain_k7"], rel=1e-9)


def test_alphas_match_tau_and_calibrated_confidences():
    a = ae.draw_alphas(4.0, 1.0, 4096, seed=0)
    assert ae.mean_tau(a) == pytest.approx(4.0, abs=1e-6)
    assert a.std() > 0.1  # heterogeneous across requests
    c = ae.confidences(a[:8], 0.0, seed=0)
    assert torch.allclose(c, a[:8].unsqueeze(1).expand(-1, 7), atol=1e-9)
    full = torch.full((8,), 7)
    assert ae.expected_tokens(a[:8], full) == pytest.approx(
        float((1 + sum(a[:8] ** j for j in range(1, 8))).sum())
    )


def test_adaptive_equals_plain_when_verifying_is_free_and_wins_when_it_is_not():
    class Args:
        draws, spread, conf_noise = 2, 1.0, 0.0

    free = synthetic_results()
    for c in free["configs"].values():  # flat verify cost: every draft is worth verifying
        for d in c["decode"].values():
            d["median_ms"] = 6.0 + (1.5 if "k" in c else 0.0)
    free["configs"]["target"]["forward_ms_by_tokens"] = {str(m): 6.0 for m in (1, 2048)}
    r = ae.emulate(ae.CostModel.from_results(free), 128, 3.0, Args)
    assert r["adaptive_round_sps"] == pytest.approx(r["plain_k7"], rel=1e-9)
    steep = ae.emulate(ae.CostModel.from_results(synthetic_results()), 128, 3.0, Args)
    assert steep["adaptive_round_sps"] > 1.1 * steep["plain_k7"]
    assert steep["mean_verified"]["adaptive_round_sps"] < 7


def test_summary_has_every_headline_key_with_its_source(tmp_path):
    from lab.gpu.summarize_8b import summarize

    (tmp_path / "vllm_round").mkdir()
    (tmp_path / "vllm_round" / "results.json").write_text(json.dumps(synthetic_results()))
    rows = [
        {"variant": "a", "tokens_per_s": 10.0, "mfu_spec_peak": 0.1, "peak_gib": 50.0},
        {"variant": "b", "tokens_per_s": 20.0, "mfu_spec_peak": 0.2, "peak_gib": 60.0},
        {"variant": "c", "error": "x"},
    ]
    for name in ("train_qwen3_8b.json", "train_smollm2.json"):
        (tmp_path / name).write_text(json.dumps({"rows": rows}))

    class Args:
        draws, spread, conf_noise = 1, 1.0, 0.5

    cost = ae.CostModel.from_results(synthetic_results())
    (tmp_path / "adaptive").mkdir()
    (tmp_path / "adaptive" / "adaptive_emulation.json").write_text(
        json.dumps({"rows": [ae.emulate(cost, 128, 4.0, Args)]})
    )
    s = summarize(tmp_path)
    keys = (
        "train_tokens_per_s",
        "train_mfu_spec_peak",
        "train_peak_gib",
        "train_tokens_per_s_smollm2",
        "round_over_step_b1_v32k",
        "round_over_step_b128_v32k",
        "speedup_tau4_b128_plain",
        "speedup_tau4_b128_adaptive",
    )
    for k in keys:
        assert s[k] is not None and (tmp_path / s[f"{k}_source"]).exists(), k
    assert s["train_tokens_per_s"] == 20.0 and s["train_variant"] == "b"
    assert s["kind"] == "measured" and s["train_variant_source"] == "train_qwen3_8b.json"
    # The speed-ups at an assumed tau are labelled as emulations, the measured costs are not.
    assert s["speedup_tau4_b128_adaptive_kind"] == "emulated"
    assert "round_over_step_b128_v32k_kind" not in s


def test_bench_8b_leaves_out_the_stages_skip_stages_names(tmp_path):
    """A short session names stages to leave out; they are recorded as skipped, never run, and
    with every vLLM stage left out nothing waits for a vLLM install (it would wait 20 minutes)."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    names = ["train_qwen3_8b", "train_smollm2", "vllm_a", "vllm_b", "vllm_k", "adaptive"]
    env = dict(os.environ, OUT=str(tmp_path), SKIP_STAGES=" ".join(names))
    subprocess.run(["bash", "lab/gpu/bench_8b.sh", "all"], cwd=root, env=env, timeout=60)
    stages = (tmp_path / "stages.txt").read_text().split("\n")
    assert [line.split()[1:] for line in stages if line] == [["skip", n] for n in names]
    assert not (tmp_path / "train_smollm2.log").exists()


def test_vllm_budget_searches_past_algorithm_1s_first_non_improvement():
    """A verify cost that rises steeply for the first admissions, then flattens: Algorithm 1
    stops at the first admission that lowers Theta and verifies nothing; vLLM 0.34's budget (the
    first argmax over every budget) verifies all, and is the brute-force best of every budget."""
    res = synthetic_results(draft_ms=1.0)
    res["configs"]["target"]["forward_ms_by_tokens"] = {"8": 5.0, "9": 9.0, "24": 9.5, "64": 10.0}
    cost = ae.CostModel.from_results(res)
    conf = torch.full((8, 7), 0.9, dtype=torch.float64)
    table = cost.round_table(8)
    assert int(ae.plan_verify_lengths(conf, table).verify_len.sum()) == 0
    v = ae.vllm_budget_lengths(conf, ae.budget_costs(cost, 8))
    assert int(v.sum()) == 56

    def rate(m):  # expected tokens per second verifying the m best slots (all equal here)
        return (8 + sum(0.9 ** (1 + i // 8) for i in range(m))) / cost.t_adaptive(8, 8 + m)

    assert max(range(57), key=rate) == 56


def test_dispatch_log_counts_what_each_manager_returns():
    """The hook wraps the target's and the draft's CUDA-graph managers in place (vLLM calls them
    through the instance) and counts the descriptors they return, per collection."""
    from types import SimpleNamespace as NS

    class Manager:
        def __init__(self, q):
            self.q = q

        def dispatch(self, num_reqs, num_tokens, *a, **k):
            mode = "FULL" if num_tokens == num_reqs * self.q else "NONE"
            return NS(cg_mode=NS(name=mode), num_tokens=num_tokens, num_reqs=num_reqs)

    runner = NS(cudagraph_manager=Manager(8), speculator=NS(query_cudagraph_manager=Manager(7)))
    worker = NS(model_runner=runner)
    assert vrc._install_dispatch_log(worker) == ["target: Manager", "draft: Manager"]
    for _ in range(3):
        runner.cudagraph_manager.dispatch(8, 64)
        runner.speculator.query_cudagraph_manager.dispatch(8, 56)
    runner.cudagraph_manager.dispatch(8, 4096)  # a prefill step
    assert vrc._collect_dispatch_log(worker) == {
        "target FULL 64 8": 3,
        "draft FULL 56 8": 3,
        "target NONE 4096 8": 1,
    }
    assert vrc._collect_dispatch_log(worker) == {}


def test_round_dispatch_counts_only_uniform_decode_batches(tmp_path):
    from lab.gpu import summarize_round_dispatch as srd

    counts = {
        "target FULL 64 8": 40,  # verify of 8 requests x (K + 1)
        "target PIECEWISE 64 8": 2,
        "draft FULL 56 8": 42,  # draft query, 8 requests x K
        "target NONE 4096 8": 1,  # prefill: not a decode batch
        "target PIECEWISE 512 None": 1,
    }
    shares = srd.dispatch_shares("dspark_v32k_k7", 7, counts)
    assert shares["target"]["decode"] == 42 and shares["target"]["decode_full"] == 40
    assert shares["target"]["other"] == {"target NONE 4096 8": 1, "target PIECEWISE 512 None": 1}
    assert shares["draft"] == {"decode": 42, "decode_full": 42, "other": {}}
    # target alone: q = 1
    assert srd.dispatch_shares("target", 0, {"target FULL 8 8": 5})["target"]["decode_full"] == 5
    for run, cfg, ms in (
        ("round_tokens", "target", 4.0),
        ("round_requests", "dspark_v32k_k7", 5.0),
    ):
        (tmp_path / run).mkdir()
        decode = {"8": {"median_ms": ms}, "dispatch_8": counts if cfg != "target" else {}}
        res = {
            "args": {"capture": run.split("_")[1]},
            "configs": {cfg: {"k": 7, "vocab": "v32k", "decode": decode}},
        }
        (tmp_path / run / "results.json").write_text(json.dumps(res))
    summary = tmp_path / "summary.json"
    assert srd.main([str(tmp_path), "--summary", str(summary)]) == 0
    s = json.loads(summary.read_text())
    assert s["vllm034_round_over_step_b8"] == 1.25
    assert s["vllm034_decode_full_graph_share"] == pytest.approx(40 / 42)
    assert s["vllm034_round_over_step_b8_source"] == "round_dispatch.json"
