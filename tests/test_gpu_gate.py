"""The serve-time gate's verdict logic (scripts/gpu/vllm_vs_engine.py) and the acceptance
table/plot arithmetic (scripts/plot_acceptance.py), on CPU with a tiny random target: the GPU
run itself is in docs/benchmarks.md; here the checks must reject what they exist to catch."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from scripts.gpu.vllm_vs_engine import cut, gate, partings
from scripts.plot_acceptance import conditional, pooled_tau
from tests.tiny_assets import build_tiny_random_target


def greedy(target, prompts, n=6):
    m = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    outs = []
    for p in prompts:
        g = m.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)
        outs.append(g[0, len(p) :].tolist())
    return outs


def report(spec, base, parts, rates_v=(0.5, 0.2), rates_e=(0.52, 0.21)):
    rate = lambda r: {"per_position_rate": list(r)}
    return {
        "vllm": {"0.0": {"outputs": spec, **rate(rates_v)}, "1.0": rate(rates_v)},
        "engine": {"0.0": {"outputs": base, **rate(rates_e)}, "1.0": rate(rates_e)},
        "hf_greedy": base,
        "vllm_greedy_partings": parts,
    }


def test_gate_passes_lossless_runs_and_rejects_a_wrong_token(tmp_path):
    target = str(build_tiny_random_target(tmp_path / "t"))
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    base = greedy(target, prompts)
    assert partings(base, base, prompts, target, "cpu") == []
    ok = gate(report(base, base, []), set(), tol=0.05, tie_tol=1e-3)
    assert all(ok.values())

    # A verifier that emits a token the target ranks lower: the float64 gap exposes it.
    wrong = [list(s) for s in base]
    m = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    logits = m(torch.tensor([prompts[1] + base[1][:2]])).logits[0, -1]
    wrong[1][2] = int(logits.topk(2).indices[1])  # the runner-up
    parts = partings(wrong, base, prompts, target, "cpu")
    assert [(p["prompt"], p["step"], p["fp64_argmax"]) for p in parts] == [(1, 2, base[1][2])]
    assert parts[0]["logit_gap"] < 0
    bad = gate(report(wrong, base, parts), set(), tol=0.05, tie_tol=1e-3)
    assert not bad["vllm_greedy_equals_vllm_target_greedy_up_to_ties"]
    assert bad["engine_greedy_equals_hf_greedy"]
    # ... unless the gap is within the tie tolerance.
    loose = gate(report(wrong, base, parts), set(), tol=0.05, tie_tol=abs(parts[0]["logit_gap"]))
    assert loose["vllm_greedy_equals_vllm_target_greedy_up_to_ties"]


def test_gate_rejects_acceptance_drift_and_cuts_at_stops():
    same = [[1, 2, 3]]
    drift = gate(report(same, same, [], rates_e=(0.5, 0.26)), set(), tol=0.05, tie_tol=1e-3)
    assert not drift["per_pos_within_tol_T0.0"] and not drift["per_pos_within_tol_T1.0"]
    assert cut([[4, 9, 7, 9], [4, 5]], {9}) == [[4], [4, 5]]


def test_pooled_tau_weights_rows_by_drafts_and_conditional_drops_rare_positions():
    rows = [
        {"drafts": 100, "per_position_rate": [0.5, 0.25, 0.0]},
        {"drafts": 300, "per_position_rate": [0.2, 0.1, 0.05]},
    ]
    accepted = 100 * 0.75 + 300 * 0.35
    assert abs(pooled_tau(rows) - (1 + accepted / 400)) < 1e-12
    pos, p = conditional(rows[1], min_reached=30)  # reached: 300, 60, 30
    assert pos == [1, 2, 3]
    assert [round(x, 6) for x in p] == [0.2, 0.5, 0.5]
    assert conditional(rows[1], min_reached=31)[0] == [1, 2]
