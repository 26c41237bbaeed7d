"""The embedded engine against independent references (CPU, tiny float64 models).

- greedy: token-for-token equal to HF `generate` on the target, both layouts, full and reduced
  draft vocab, batch 1 and continuous batching with more requests than slots;
- probabilistic: the law of every generated token equals the target's (exact Markov-chain
  reference on a context-free target), outputs reproducible and batch-invariant per seed;
- counters: tokens per round = accepted + 1, vLLM's counters consistent with each other;
- adaptive verification: verifying nothing reproduces target-only sampling exactly;
- stops, aborts and option validation.
"""

from __future__ import annotations

import pytest
import torch

from serve.engine import Engine, EngineOptions, OptionsError, SamplingParams, SpecDecodeStats
from serve.engine.loader import check_pair
from tests.unit.test_engine_helpers import (
    EOS,
    V,
    make_draft,
    make_target,
    reference_greedy,
    save_draft,
    save_target,
    target_config,
    transition_matrix,
)

PROMPTS = [[5, 7, 9], [11, 12, 13, 14, 15, 16, 17, 18, 19], [20], [30, 31, 32, 33, 34], [40, 41]]
MAX_TOKENS = [17, 9, 23, 12, 20]


pytestmark = pytest.mark.usefixtures("torch_single_thread")


def make_engine(target, draft, eos=(), **kw) -> Engine:
    kw.setdefault("max_model_len", 96)
    opts = EngineOptions(
        target="<memory>", checkpoint=None if draft is None else "<memory>", dtype="float64", **kw
    )
    return Engine(target, draft, opts, eos_token_ids=list(eos))


def greedy_params():
    return [SamplingParams(max_tokens=n) for n in MAX_TOKENS]


def sampled_params(temperature: float = 1.0):
    return [
        SamplingParams(max_tokens=n, temperature=temperature, seed=i)
        for i, n in enumerate(MAX_TOKENS)
    ]


# ---------------------------------------------------------------------- greedy exactness
@pytest.mark.parametrize("tuned", [False, True], ids=["random-draft", "tuned-draft"])
@pytest.mark.parametrize("draft_vocab", [None, 40], ids=["full-vocab", "reduced-vocab"])
@pytest.mark.parametrize("sample_from_anchor", [True, False], ids=["anchor-first", "1+N"])
def test_greedy_equals_target_generate(sample_from_anchor, draft_vocab, tuned):
    # A tuned draft needs a context-free target; the random draft runs on a full random target.
    target = make_target(0, predictable=tuned)
    draft = make_draft(target, sample_from_anchor, draft_vocab, tuned)
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]

    solo = make_engine(target, draft, draft_sampling="greedy", max_num_seqs=1)
    for p, n, ref in zip(PROMPTS, MAX_TOKENS, refs):
        assert solo.generate([p], SamplingParams(max_tokens=n)) == [ref]

    # 5 requests of different lengths through 3 slots: later ones join mid-run.
    batched = make_engine(target, draft, max_num_seqs=3)
    assert batched.generate(PROMPTS, greedy_params()) == refs
    spec = batched.stats.spec
    assert spec.num_drafts > 0 and spec.num_draft_tokens == spec.num_drafts * (
        draft.config.num_speculative_tokens
    )
    if tuned:
        assert spec.num_accepted_tokens > 0
        assert spec.mean_acceptance_length > 1.5


def test_llama_target_greedy_equals_generate():
    """A target whose config has no per-layer attention types (Llama, e.g. SmolLM2, with tied
    embeddings) takes one 4D mask, not a dict of them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    q = target_config()
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    keys += ("num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
    torch.manual_seed(0)
    cfg = LlamaConfig(**{k: getattr(q, k) for k in keys}, tie_word_embeddings=True)
    target = LlamaForCausalLM(cfg).to(torch.float64).eval()
    draft = make_draft(target)
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    assert make_engine(target, draft, max_num_seqs=3).generate(PROMPTS, greedy_params()) == refs


def test_target_only_equals_generate():
    target = make_target(3)
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    eng = make_engine(target, None, max_num_seqs=2)
    assert eng.generate(PROMPTS, greedy_params()) == refs
    assert eng.num_spec == 0 and eng.stats.spec.num_drafts == 0


def test_fewer_speculative_tokens_than_layout():
    target = make_target(0, predictable=True)
    draft = make_draft(target, True, None, tuned=True, block_size=5)
    eng = make_engine(target, draft, num_speculative_tokens=2)
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    assert eng.generate(PROMPTS, greedy_params()) == refs
    assert eng.stats.spec.num_accepted_tokens_per_pos.__len__() == 2
    assert eng.stats.spec.mean_acceptance_length == pytest.approx(3.0)


# ---------------------------------------------------------------------- counters
@pytest.mark.parametrize("tuned", [False, True])
def test_counters_add_up(tuned):
    target = make_target(0, predictable=True)
    draft = make_draft(target, True, 40, tuned=tuned, strength=4.0)
    eng = make_engine(target, draft, max_num_seqs=3)
    for p, n in zip(PROMPTS, MAX_TOKENS):
        eng.add_request(p, SamplingParams(max_tokens=n))
    rounds, accepted, emitted_full = 0, 0, 0
    total = 0
    while eng.has_unfinished():
        for o in eng.step():
            total += len(o.new_token_ids)
            if o.num_accepted is None:  # the prefill token
                assert len(o.new_token_ids) == 1
                continue
            rounds += 1
            accepted += o.num_accepted
            if o.finished:  # max_tokens may cut a round short
                assert 1 <= len(o.new_token_ids) <= o.num_accepted + 1
            else:
                assert len(o.new_token_ids) == o.num_accepted + 1
                emitted_full += len(o.new_token_ids)
    s = eng.stats
    spec = s.spec
    assert total == sum(MAX_TOKENS) == s.generation_tokens
    assert spec.num_drafts == rounds and spec.num_accepted_tokens == accepted
    assert sum(spec.num_accepted_tokens_per_pos) == spec.num_accepted_tokens
    per_pos = spec.num_accepted_tokens_per_pos
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # accepted prefixes
    assert spec.mean_acceptance_length == pytest.approx(1 + accepted / rounds)
    assert s.time_backbone > 0 and s.time_markov > 0 and s.time_verify > 0
    line = eng.stat_logger.maybe_log(s, force=True)
    assert f"Mean acceptance length: {spec.mean_acceptance_length:.2f}" in line
    if tuned:
        assert accepted > 0


def test_rounds_per_request_sum_to_the_counters_and_outputs_equal_generate():
    """`generate_with_rounds` (what eval_acceptance pairs prompts by): each request's rounds and
    accepted drafts, summed over requests, are the spec-decode counters; its ids are `generate`'s;
    a round emits at most accepted + 1 tokens."""
    target = make_target(0, predictable=True)
    draft = make_draft(target, True, 40, tuned=True, strength=4.0)
    eng = make_engine(target, draft, max_num_seqs=3)
    before = eng.stats.snapshot().spec
    got = eng.generate_with_rounds(PROMPTS, greedy_params())
    added = eng.stats.snapshot().spec.since(before)
    assert sum(len(r) for _, r in got) == added.num_drafts > 0
    assert sum(sum(r) for _, r in got) == added.num_accepted_tokens > 0
    for (ids, rounds), n in zip(got, MAX_TOKENS, strict=True):
        assert len(ids) == n and 1 + len(rounds) + sum(rounds) >= n
    again = make_engine(target, draft, max_num_seqs=3).generate(PROMPTS, greedy_params())
    assert again == [ids for ids, _ in got]


def test_stats_since_and_conditional_acceptance():
    """The one definition behind the engine log, eval_acceptance, the vLLM gate and the plot."""
    before = SpecDecodeStats(3, 10, 30, 12, [6, 4, 2])
    after = SpecDecodeStats(3, 30, 90, 32, [16, 10, 6])
    d = after.since(before)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (20, 60, 20)
    assert d.num_accepted_tokens_per_pos == [10, 6, 4]
    assert d.reached_per_pos() == [20, 10, 6]
    assert d.conditional_acceptance() == [0.5, 0.6, 4 / 6]
    assert d.report() == {
        "drafts": 20,
        "draft_tokens": 60,
        "verified_draft_tokens": None,  # not reported (counters read from vLLM)
        "accepted_per_pos": [10, 6, 4],
        "reached_per_pos": [20, 10, 6],
        "mean_acceptance_length": 2.0,
        "per_position_rate": [0.5, 0.3, 0.2],
        "conditional_acceptance": [0.5, 0.6, 4 / 6],
    }
    fresh = SpecDecodeStats()  # before any draft: no per-position list yet
    assert after.since(fresh).num_accepted_tokens_per_pos == [16, 10, 6]
    # The engine's verified count rides along: 90 scheduled, 50 verified after adaptive trims.
    eng_before, eng_after = before.copy(), after.copy()
    eng_before.num_verified_draft_tokens, eng_after.num_verified_draft_tokens = 20, 70
    e = eng_after.since(eng_before)
    assert (e.num_draft_tokens, e.num_verified_draft_tokens) == (60, 50)
    assert e.report()["verified_draft_tokens"] == 50 and e.draft_acceptance_rate == 20 / 60
    assert e.verified_acceptance_rate == 20 / 50 and d.verified_acceptance_rate is None
    assert eng_after.since(fresh).num_verified_draft_tokens == 70
    counted = SpecDecodeStats(3, num_verified_draft_tokens=0)
    counted.add(2, 6, 3, [2, 1, 0], verified_draft_tokens=4)
    counted.add(1, 3, 1, [1, 0, 0])  # no trim: all scheduled drafts verified
    got = (counted.num_drafts, counted.num_draft_tokens, counted.num_verified_draft_tokens)
    assert got == (3, 9, 7)
    with pytest.raises(ValueError):  # counters of another block size
        after.since(SpecDecodeStats(2, 1, 2, 1, [1, 0]))


# ---------------------------------------------------------------------- probabilistic
def tv_check(outs: torch.Tensor, start_token: int, P: torch.Tensor):
    """Every position's empirical law vs the exact chain law e_v P^(k+1); returns the TVs."""
    m = outs.shape[0]
    law = torch.zeros(V, dtype=torch.float64)
    law[start_token] = 1.0
    tvs = []
    for k in range(outs.shape[1]):
        law = law @ P
        emp = torch.bincount(outs[:, k], minlength=V).double() / m
        tv = 0.5 * (emp - law).abs().sum().item()
        # E|emp - p| <= sqrt(p (1 - p) / m): a 2.5x margin over the expected TV keeps the
        # false-alarm rate negligible, while a wrong law (e.g. the draft's) is off by >> 0.1.
        bound = 0.5 * (law * (1 - law) / m).sqrt().sum().item()
        assert tv < 2.5 * bound + 0.01, f"position {k}: TV {tv:.3f} (noise ~{bound:.3f})"
        tvs.append(tv)
    return tvs


@pytest.mark.parametrize(
    "case",
    ["tuned-sharp", "tuned-soft-reduced", "random-draft", "greedy-drafts-1+N"],
)
def test_probabilistic_output_law_equals_target(case):
    target = make_target(0, predictable=True, sharpness=30.0)
    sampling = "greedy" if case.startswith("greedy") else "probabilistic"
    draft = {
        "tuned-sharp": lambda: make_draft(target, True, None, tuned=True),
        "tuned-soft-reduced": lambda: make_draft(target, True, 40, tuned=True, strength=3.0),
        "random-draft": lambda: make_draft(target, True, None),
        "greedy-drafts-1+N": lambda: make_draft(target, False, None, tuned=True, strength=3.0),
    }[case]()
    temp = 0.8
    eng = make_engine(target, draft, draft_sampling=sampling, max_num_seqs=64)
    m, k = 1500, 4
    prompt = [5, 7, 9]
    params = [SamplingParams(max_tokens=k, temperature=temp, seed=s) for s in range(m)]
    outs = torch.tensor(eng.generate([prompt] * m, params))
    tv_check(outs, prompt[-1], transition_matrix(target, temp))
    if case != "random-draft":  # accept and reject-with-residual paths both exercised
        spec = eng.stats.spec
        assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens


def test_probabilistic_reproducible_and_batch_invariant():
    target = make_target(1)
    draft = make_draft(target, True, 40)
    p = SamplingParams(max_tokens=15, temperature=1.0, seed=1234)
    alone = make_engine(target, draft).generate([PROMPTS[1]], p)[0]
    others = [SamplingParams(max_tokens=n, temperature=0.7, seed=i) for i, n in enumerate((9, 4))]
    greedy = SamplingParams(max_tokens=12)
    mixed = make_engine(target, draft, max_num_seqs=2).generate(
        [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]], [others[0], p, others[1], greedy]
    )
    assert mixed[1] == alone
    # A greedy row inside a sampling batch stays exactly greedy.
    assert mixed[3] == reference_greedy(target, PROMPTS[3], 12)
    other_seed = SamplingParams(max_tokens=15, temperature=1.0, seed=99)
    assert make_engine(target, draft).generate([PROMPTS[1]], other_seed)[0] != alone


# ---------------------------------------------------------------------- adaptive verification
def sps_table(tmp_path, sps):
    from common.sampling import SPSTable

    path = tmp_path / "sps.json"
    SPSTable(list(range(1, 65)), [float(sps(n)) for n in range(1, 65)]).save(path)
    return str(path)


def test_adaptive_verifying_nothing_is_plain_sampling(tmp_path):
    target = make_target(2)
    draft = make_draft(target, True, None)
    # Steps/s collapsing with size: admitting any draft never improves Theta.
    table = sps_table(tmp_path, lambda n: 10.0 ** (-3 * n))
    params = [
        SamplingParams(max_tokens=n, temperature=1.0, seed=i) for i, n in enumerate(MAX_TOKENS)
    ]
    ada = make_engine(
        target,
        draft,
        adaptive_verification=True,
        adaptive_policy="algorithm1",
        sps_table=table,
        max_num_seqs=3,
    )
    plain = make_engine(target, None, max_num_seqs=2)
    assert ada.generate(PROMPTS, params) == plain.generate(PROMPTS, params)
    spec = ada.stats.spec
    assert spec.num_verified_draft_tokens == 0 and spec.num_drafts > 0
    assert spec.num_draft_tokens == spec.num_drafts * ada.num_spec  # scheduled, as vLLM counts


def test_adaptive_greedy_still_exact_and_full_table_verifies_all(tmp_path):
    target = make_target(0, predictable=True)
    draft = make_draft(target, True, None, tuned=True, strength=4.0)
    refs = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    for policy in ("vllm", "algorithm1"):
        profiled = make_engine(
            target, draft, adaptive_verification=True, adaptive_policy=policy, max_num_seqs=3
        )
        assert profiled.generate(PROMPTS, greedy_params()) == refs
    # Constant steps/s: every draft with confidence > 0 improves Theta, so all are verified and
    # sampling matches non-adaptive decoding draw for draw.
    flat = sps_table(tmp_path, lambda n: 100.0)
    params = [
        SamplingParams(max_tokens=n, temperature=1.0, seed=i) for i, n in enumerate(MAX_TOKENS)
    ]
    ada = make_engine(
        target, draft, adaptive_verification=True, adaptive_policy="algorithm1", sps_table=flat
    )
    full = make_engine(target, draft)
    assert ada.generate(PROMPTS, params) == full.generate(PROMPTS, params)
    a, f = ada.stats.spec, full.stats.spec
    assert a.num_verified_draft_tokens == f.num_verified_draft_tokens == f.num_draft_tokens
    assert a.num_draft_tokens == f.num_draft_tokens


# ---------------------------------------------------------------------- stops and aborts
def test_eos_and_length_stops():
    target = make_target(4)
    ref = reference_greedy(target, PROMPTS[1], 20)
    stop_tok = ref[5]
    eng = make_engine(target, make_draft(target), eos=[stop_tok])
    out = eng.generate([PROMPTS[1]], SamplingParams(max_tokens=20))[0]
    assert out == ref[: ref.index(stop_tok) + 1]
    assert eng.generate([PROMPTS[1]], SamplingParams(max_tokens=20, ignore_eos=True))[0] == ref
    # max_model_len caps prompt + output.
    short = make_engine(target, make_draft(target), max_model_len=16)
    out = short.generate([PROMPTS[1]], SamplingParams(max_tokens=50))[0]
    assert out == reference_greedy(target, PROMPTS[1], 16 - len(PROMPTS[1]))


def test_abort_frees_the_slot_and_others_continue():
    target = make_target(0, predictable=True)
    eng = make_engine(target, make_draft(target, tuned=True, strength=2.0), max_num_seqs=2)
    a = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=40))
    b = eng.add_request(PROMPTS[1], SamplingParams(max_tokens=30))
    c = eng.add_request(PROMPTS[2], SamplingParams(max_tokens=10))
    got = {a: [], b: [], c: []}
    for o in eng.step() + eng.step():
        got[o.request_id] += o.new_token_ids
    assert eng.abort_request(a) and not eng.abort_request("nope")
    reasons = {}
    while eng.has_unfinished():
        for o in eng.step():
            got[o.request_id] += o.new_token_ids
            if o.finished:
                reasons[o.request_id] = o.finish_reason
    assert reasons == {a: "abort", b: "length", c: "length"}
    assert got[b] == reference_greedy(target, PROMPTS[1], 30)
    assert got[c] == reference_greedy(target, PROMPTS[2], 10)
    assert eng.stats.requests_aborted == 1 and not eng.requests


def test_add_request_rejects_bad_prompts():
    eng = make_engine(make_target(0), None, max_model_len=8)
    with pytest.raises(ValueError, match="empty"):
        eng.add_request([], SamplingParams())
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request(list(range(8)), SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        eng.add_request([V + 3], SamplingParams())
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)


# ---------------------------------------------------------------------- validation and loading
def test_option_and_pairing_errors():
    with pytest.raises(OptionsError, match="dtype"):
        EngineOptions(target="t", dtype="int8")
    with pytest.raises(OptionsError, match="draft_sampling"):
        EngineOptions(target="t", draft_sampling="beam")
    with pytest.raises(OptionsError, match="needs a draft"):
        EngineOptions(target="t", adaptive_verification=True)
    target = make_target(0)
    draft = make_draft(target, sample_from_anchor=False, block_size=4)
    with pytest.raises(OptionsError, match="exceeds the checkpoint's 1\\+N layout"):
        make_engine(target, draft, num_speculative_tokens=4)
    with pytest.raises(OptionsError, match="adaptive_policy"):
        EngineOptions(target="t", adaptive_policy="oracle")
    with pytest.raises(OptionsError, match="sps_table"):
        EngineOptions(target="t", checkpoint="c", adaptive_verification=True, sps_table="x.json")
    # A draft built for a deeper target: its layer ids do not exist here.
    from transformers import Qwen3ForCausalLM

    from tests.unit.test_engine_helpers import target_config

    shallow = Qwen3ForCausalLM(target_config(layers=2)).to(torch.float64)
    with pytest.raises(OptionsError, match="target_layer_ids: draft .* out of range"):
        make_engine(shallow, draft)

    class BigTokenizer:
        def __len__(self):
            return V + 10

    with pytest.raises(OptionsError, match="tokenizer: 106 tokens, target vocab_size 96"):
        check_pair(target, draft.config, BigTokenizer())
    other_vocab = target_config()
    other_vocab.vocab_size = V + 8
    wide = Qwen3ForCausalLM(other_vocab).to(torch.float64)
    with pytest.raises(OptionsError, match="vocab_size: draft 96, target 104"):
        make_engine(wide, draft)


def test_from_options_loads_folders(tmp_path):
    target = make_target(0, predictable=True)
    draft = make_draft(target, True, 40, tuned=True)
    save_target(target, tmp_path / "target")
    save_draft(draft, tmp_path / "draft")
    opts = EngineOptions(
        target=str(tmp_path / "target"),
        checkpoint=str(tmp_path / "draft"),
        dtype="float64",
        draft_sampling="greedy",
        max_model_len=64,
    )
    eng = Engine.from_options(opts)
    assert eng.tokenizer is not None and EOS in eng.eos_token_ids
    assert eng.num_spec == 4
    p = SamplingParams(max_tokens=12, ignore_eos=True)
    assert eng.generate([PROMPTS[0]], p)[0] == reference_greedy(target, PROMPTS[0], 12)
    with pytest.raises(OptionsError, match="not a folder"):
        Engine.from_options(EngineOptions(target=str(tmp_path / "missing")))
