"""The engine's adaptive verification with vLLM 0.34's policy (the default) and its fallback, the
online acceptance estimator, for a draft without a confidence head; fp64 Gumbel noise.

References: target-only sampling (a budget of zero verifies nothing, so every token is the
target's own keyed draw), non-adaptive decoding (a flat cost verifies every draft, draw for
draw), the target's greedy `generate`, and the estimator's own update run by hand on the
engine's verdicts.
"""

from __future__ import annotations

import pytest
import torch

from common.sampling.acceptance_estimator import OnlineAcceptanceEstimator
from common.sampling.draft_budget import PaddedCostTable, plan_budgeted_verify_lengths
from serve.engine import SamplingParams
from tests.unit.test_engine import MAX_TOKENS, PROMPTS, greedy_params, make_engine, sampled_params
from tests.unit.test_engine_helpers import make_draft, make_target, reference_greedy

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def cost_table(tmp_path, verify_ms, max_reqs=8, n=4) -> str:
    """A saved PaddedCostTable: verify_ms(q) for every R, a 1 ms draft step."""
    path = tmp_path / "cost.json"
    rows = [[0.0] + [float(verify_ms(q)) for q in range(1, n + 2)] for _ in range(max_reqs + 1)]
    PaddedCostTable([1.0] * (max_reqs + 1), rows, {}).save(path)
    return str(path)


@pytest.mark.parametrize("confidence", [True, False], ids=["confidence-head", "estimator"])
def test_zero_budget_is_plain_sampling_and_flat_cost_verifies_all(tmp_path, confidence):
    target = make_target(2)
    draft = make_draft(target, True, None, confidence=confidence)
    params = sampled_params()
    # A verify forward with any draft costs 1e6 ms: the argmax is the zero budget.
    steep = cost_table(tmp_path, lambda q: 1.0 if q == 1 else 1e6)
    ada = make_engine(target, draft, adaptive_verification=True, cost_table=steep, max_num_seqs=3)
    plain = make_engine(target, None, max_num_seqs=2)
    assert ada.generate(PROMPTS, params) == plain.generate(PROMPTS, params)
    spec, n = ada.stats.spec, ada.num_spec
    # Nothing verified, yet N drafts per round were scheduled (vLLM's num_draft_tokens).
    assert spec.num_verified_draft_tokens == 0 and spec.num_drafts > 0
    assert spec.num_draft_tokens == spec.num_drafts * n
    # Flat cost: expected tokens only grow with the budget, so every draft is verified.
    flat = cost_table(tmp_path, lambda q: 5.0)
    ada = make_engine(target, draft, adaptive_verification=True, cost_table=flat, max_num_seqs=3)
    full = make_engine(target, draft, max_num_seqs=3)
    assert ada.generate(PROMPTS, params) == full.generate(PROMPTS, params)
    a, f = ada.stats.spec, full.stats.spec
    assert a.num_draft_tokens == a.num_verified_draft_tokens == f.num_verified_draft_tokens
    assert a.num_draft_tokens == f.num_draft_tokens == f.num_drafts * n


def test_estimator_drives_greedy_exact_decoding_and_learns_from_verdicts(tmp_path):
    target = make_target(0, predictable=True)
    draft = make_draft(target, True, None, tuned=True, strength=4.0, confidence=False)
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    # Cost grows with the padded width: budgets are partial, so verdicts grade some slots only.
    table = cost_table(tmp_path, lambda q: 2.0 + q)
    eng = make_engine(target, draft, adaptive_verification=True, cost_table=table, max_num_seqs=3)
    est = eng.estimator
    assert isinstance(est, OnlineAcceptanceEstimator) and eng.conf_temperatures is None
    est.REFIT_INTERVAL = 2
    graded = []
    real_step = est.step

    def spy(rows, num_sampled, num_rejected):
        graded.append((num_sampled - 1, num_sampled - 1 + num_rejected))
        real_step(rows, num_sampled, num_rejected)

    est.step = spy
    assert eng.generate(PROMPTS, greedy_params()) == refs
    assert graded, "the estimator never saw a verdict"
    # Its statistics are exactly the verdicts the engine recorded: verified drafts per round.
    verified = sum(int(v.sum()) for _, v in graded)
    assert verified == eng.stats.spec.num_verified_draft_tokens
    assert sum(int(a.sum()) for a, _ in graded) == eng.stats.spec.num_accepted_tokens
    assert not torch.allclose(est.intercepts, torch.full_like(est.intercepts, -0.2))


def scrape(engine) -> dict[str, float]:
    """The engine's /metrics exposition, parsed: {sample name: value} (model label dropped)."""
    from prometheus_client.parser import text_string_to_metric_families

    from serve.api.metrics import make_registry, render

    text = render(make_registry(engine, "m")).decode()
    return {
        s.name: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if "position" not in s.labels and "phase" not in s.labels
    }


@pytest.mark.parametrize("adaptive", [True, False], ids=["adaptive", "plain"])
def test_draft_tokens_count_scheduled_drafts_as_vllm_and_verified_apart(tmp_path, adaptive):
    """vLLM 0.34's num_draft_tokens is the scheduler's count, N per draft, before the worker's
    adaptive trim; the engine's is the same, and what the target verified is its own counter
    (and metric). Under a budget that trims, verified < scheduled; without adaptive, equal."""
    target = make_target(0, predictable=True)
    draft = make_draft(target, True, None, tuned=True, strength=4.0)
    table = cost_table(tmp_path, lambda q: 2.0 + q)  # partial budgets: some drafts trimmed
    opts = dict(adaptive_verification=True, cost_table=table) if adaptive else {}
    eng = make_engine(target, draft, max_num_seqs=3, **opts)
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    assert eng.generate(PROMPTS, greedy_params()) == refs
    spec, n = eng.stats.spec, eng.num_spec
    assert spec.num_drafts > 0 and n > 1
    assert spec.num_draft_tokens == spec.num_drafts * n  # rounds x num_speculative_tokens
    if adaptive:
        assert 0 < spec.num_verified_draft_tokens < spec.num_draft_tokens
    else:
        assert spec.num_verified_draft_tokens == spec.num_draft_tokens
    assert spec.num_accepted_tokens <= spec.num_verified_draft_tokens
    assert spec.draft_acceptance_rate == spec.num_accepted_tokens / spec.num_draft_tokens
    assert spec.verified_acceptance_rate == (
        spec.num_accepted_tokens / spec.num_verified_draft_tokens
    )
    report = spec.report()
    assert (report["draft_tokens"], report["verified_draft_tokens"]) == (
        spec.num_draft_tokens,
        spec.num_verified_draft_tokens,
    )
    m = scrape(eng)
    assert m["vllm:spec_decode_num_draft_tokens_total"] == spec.num_draft_tokens
    verified = m["dspark:spec_decode_num_verified_draft_tokens_total"]
    assert verified == spec.num_verified_draft_tokens
    assert m["vllm:spec_decode_num_drafts_total"] == spec.num_drafts


def test_profiled_cost_table_has_the_padded_shape():
    target = make_target(0)
    draft = make_draft(target, True, None)
    eng = make_engine(target, draft, adaptive_verification=True, max_num_seqs=3)
    table = eng.cost
    assert isinstance(table, PaddedCostTable)
    assert len(table.draft_ms) == 4 and all(len(row) == 4 + 2 for row in table.verify_ms)
    for row in table.verify_ms[1:]:
        assert row[1:] == sorted(row[1:])  # a wider padded batch never looks cheaper
    assert table.meta["profiled_num_reqs"] == [1, 2, 3]


def test_fp64_gumbel_reaches_every_draw(monkeypatch):
    import common.sampling.gumbel as gumbel_mod

    seen = []
    real = gumbel_mod.gumbel_noise

    def spy(seeds, positions, cols, stream, fp64=False):
        seen.append((int(stream), fp64))
        return real(seeds, positions, cols, stream, fp64)

    monkeypatch.setattr(gumbel_mod, "gumbel_noise", spy)
    target = make_target(1)
    draft = make_draft(target, True, None, strength=1.0)
    params = sampled_params()
    out = make_engine(target, draft, max_num_seqs=3, use_fp64_gumbel=True).generate(PROMPTS, params)
    # Draft, correction/bonus and first-token draws all took float64 noise.
    assert {s for s, _ in seen} == {1, 3} and all(fp64 for _, fp64 in seen)
    again = make_engine(target, draft, max_num_seqs=3, use_fp64_gumbel=True)
    assert again.generate(PROMPTS, params) == out  # keyed: reproducible
    seen.clear()
    make_engine(target, draft, max_num_seqs=3).generate(PROMPTS, params)
    assert seen and not any(fp64 for _, fp64 in seen)  # the default stays float32
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    greedy = make_engine(target, draft, use_fp64_gumbel=True).generate(PROMPTS, greedy_params())
    assert greedy == refs


def test_fp64_target_only_equals_a_hand_loop_of_fp64_draws():
    from common.sampling import Stream, gumbel_sample

    target = make_target(1)
    eng = make_engine(target, None, use_fp64_gumbel=True)
    prompt, n = PROMPTS[0], 6
    out = eng.generate([prompt], SamplingParams(max_tokens=n, temperature=0.8, seed=5))[0]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = target(torch.tensor([ids])).logits[:, -1]
            pos = torch.tensor([len(ids) - 1])
            tok = gumbel_sample(
                logits, torch.tensor([0.8]), torch.tensor([5]), pos, stream=Stream.TARGET, fp64=True
            )
            ids.append(int(tok))
    assert out == ids[len(prompt) :]


@pytest.mark.parametrize("confidence", [True, False], ids=["confidence-head", "estimator"])
def test_previous_budget_confidence_lags_one_round_as_vllm(tmp_path, monkeypatch, confidence):
    """adaptive_budget_confidence="previous": each request's budget scores are the confidences
    that allocated its previous round (ones for its first round, where a cost that grows slowly
    with the padded width then verifies every draft), the allocation this round's; greedy stays
    exactly the target's."""
    import serve.engine.engine as engine_mod

    target = make_target(0, predictable=True)
    draft = make_draft(target, True, None, tuned=True, strength=4.0, confidence=confidence)
    table_path = cost_table(tmp_path, lambda q: 2.0 + q)
    eng = make_engine(
        target,
        draft,
        adaptive_verification=True,
        cost_table=table_path,
        max_num_seqs=3,
        adaptive_budget_confidence="previous",
    )
    calls = []  # (request ids, current [R, N], budget confidence [R, N], lengths [R])
    real_plan, real_plan_verify = engine_mod.plan_budgeted_verify_lengths, eng._plan_verify

    def plan(conf, table, num_drafts=None, *, budget_confidence=None):
        lengths = real_plan(conf, table, num_drafts, budget_confidence=budget_confidence)
        calls[-1] += [conf.float().cpu(), budget_confidence, lengths.cpu()]
        return lengths

    def plan_verify(reqs, *args):
        calls.append([[r.request_id for r in reqs]])
        return real_plan_verify(reqs, *args)

    monkeypatch.setattr(engine_mod, "plan_budgeted_verify_lengths", plan)
    eng._plan_verify = plan_verify
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    assert eng.generate(PROMPTS, greedy_params()) == refs
    n, table = eng.num_spec, PaddedCostTable.load(table_path)
    ids, conf, prev, lengths = calls[0]
    assert torch.equal(prev, torch.ones(len(ids), n))  # first round: all ones ...
    assert lengths.tolist() == [n] * len(ids)  # ... so every draft is verified
    assert plan_budgeted_verify_lengths(conf, table).tolist() != [n] * len(ids)  # not "current"
    last: dict[str, torch.Tensor] = {}
    lagged = changed = 0
    for ids, conf, prev, lengths in calls:
        for i, rid in enumerate(ids):
            assert torch.equal(prev[i], last.get(rid, torch.ones(n))), (rid, prev[i])
            lagged += rid in last
        assert torch.equal(
            lengths, plan_budgeted_verify_lengths(conf, table, budget_confidence=prev)
        )
        changed += not torch.equal(lengths, plan_budgeted_verify_lengths(conf, table))
        last.update(zip(ids, conf))
    assert lagged > 10 and changed > 0


def test_budget_confidence_option_is_checked():
    from serve.engine.options import EngineOptions, OptionsError

    assert EngineOptions(target="t").adaptive_budget_confidence == "current"
    with pytest.raises(OptionsError, match=r"choose one of \('current', 'previous'\)"):
        EngineOptions(target="t", adaptive_budget_confidence="stale")
    with pytest.raises(OptionsError, match="adaptive_policy='vllm'"):
        EngineOptions(
            target="t", adaptive_policy="algorithm1", adaptive_budget_confidence="previous"
        )
    EngineOptions(target="t", adaptive_policy="algorithm1", adaptive_budget_confidence="current")
