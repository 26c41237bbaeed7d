"""Fewer drafts than the trained block: the engine builds what vLLM 0.34 builds.

vLLM's DSpark speculator runs `num_query_per_req` query slots per request: N for anchor-first
(`[x_p, MASK x (N-1)]`), 1+N for the 1+N layout, at positions p.. and bidirectional inside the
block; the Markov loop and the confidence head run over those N slots. Because the block attends
to itself, the full trained block sliced to N is a different computation (negative control).

References: a naive per-request loop that runs the draft on exactly N (or 1+N) slots with a
hand-built mask and the Markov chain one slot at a time; the target's own greedy `generate`.
"""

from __future__ import annotations

import pytest
import torch

from serve.engine.draft_runner import DraftRunner
from serve.engine.sampler import Sampler
from tests.unit.test_engine import MAX_TOKENS, PROMPTS, greedy_params, make_engine
from tests.unit.test_engine_helpers import make_draft, make_target, reference_greedy

pytestmark = pytest.mark.usefixtures("torch_single_thread")
BLOCK = 5
LAYOUTS = [True, False]


def captured_aux(target, ids: list[int], layer_ids: list[int]) -> torch.Tensor:
    """[T, L*Ht] the target's pre-norm residual after each captured layer (HF index i+1)."""
    with torch.no_grad():
        hs = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1][0] for i in layer_ids], dim=-1)


def naive_draft(draft, aux: torch.Tensor, anchor: int, n: int):
    """One request, exactly n drafts: -> (target ids [n], confidences [n]). Plain loops."""
    cfg = draft.config
    p, off = aux.shape[0], cfg.draft_slot_offset
    q = n + off  # query slots vLLM runs
    ctx_kv = draft.context_kv(aux.unsqueeze(0), torch.arange(p).unsqueeze(0))
    ids = torch.tensor([[anchor] + [cfg.mask_token_id] * (q - 1)])
    pos = torch.arange(p, p + q).unsqueeze(0)
    mask = torch.ones(1, q, p + q, dtype=torch.bool)  # all context + the whole block
    with torch.no_grad():
        h = draft.backbone(ids, pos, ctx_kv, mask)[0, off:]  # [n, H]
        prev, state, out, conf = torch.tensor([anchor]), None, [], []
        for j in range(n):
            bias, e, state = draft.markov_step(prev, h[j : j + 1], state)
            logits = draft.compute_draft_logits(h[j : j + 1]) + bias
            conf.append(float(draft.compute_confidence(h[j : j + 1], e)))
            prev = draft.map_draft_to_target(logits.argmax(-1))
            out.append(int(prev))
    return out, conf


def runner_drafts(draft, target, prompts, n):
    runner = DraftRunner(draft, slots=len(prompts), capacity=64, num_speculative_tokens=n)
    layer_ids = draft.config.target_layer_ids
    for row, ids in enumerate(prompts):
        aux = captured_aux(target, ids, layer_ids).unsqueeze(0)
        runner.write_context([row], aux, torch.zeros(1, dtype=torch.long))
    anchors = torch.tensor([7 + row for row in range(len(prompts))])
    lens = torch.tensor([len(ids) for ids in prompts])
    r = len(prompts)
    prop = runner.propose(
        list(range(r)),
        anchors,
        lens,
        Sampler("greedy"),
        torch.zeros(r),
        torch.arange(r),
        want_confidence=True,
    )
    return anchors, prop.walk


@pytest.mark.parametrize("sample_from_anchor", LAYOUTS, ids=["anchor-first", "1+N"])
def test_drafts_equal_a_draft_run_on_exactly_n_slots(sample_from_anchor):
    target = make_target(3)
    draft = make_draft(target, sample_from_anchor, None, block_size=BLOCK, seed=4)
    native = draft.config.num_speculative_tokens
    prompts = [[5, 7, 9, 3], [11, 12, 13, 14, 15, 16, 17], [20, 21]]
    sliced_differs = False
    for n in range(1, native + 1):
        anchors, walk = runner_drafts(draft, target, prompts, n)
        assert walk.draft_ids.shape == (len(prompts), n)
        for row, ids in enumerate(prompts):
            aux = captured_aux(target, ids, draft.config.target_layer_ids)
            ref_ids, ref_conf = naive_draft(draft, aux, int(anchors[row]), n)
            assert walk.draft_ids[row].tolist() == ref_ids, (n, row)
            torch.testing.assert_close(
                walk.confidence[row].double(),
                torch.tensor(ref_conf, dtype=torch.float64),
                rtol=1e-5,
                atol=1e-6,
            )
        # Negative control: the first n slots of the full trained block are another computation.
        _, full = runner_drafts(draft, target, prompts, native)
        if n < native and not torch.equal(full.confidence[:, :n], walk.confidence):
            sliced_differs = True
    assert sliced_differs, "the full block sliced to N should differ from an N-slot block"


@pytest.mark.parametrize("sample_from_anchor", LAYOUTS, ids=["anchor-first", "1+N"])
def test_greedy_output_and_acceptance_for_every_n(sample_from_anchor):
    random_target = make_target(0)
    tuned_target = make_target(0, predictable=True)
    random_draft = make_draft(random_target, sample_from_anchor, None, block_size=BLOCK)
    tuned_draft = make_draft(tuned_target, sample_from_anchor, None, tuned=True, block_size=BLOCK)
    refs = {
        id(t): [reference_greedy(t, p, m) for p, m in zip(PROMPTS, MAX_TOKENS)]
        for t in (random_target, tuned_target)
    }
    native = random_draft.config.num_speculative_tokens
    for n in range(1, native + 1):
        for target, draft in ((random_target, random_draft), (tuned_target, tuned_draft)):
            eng = make_engine(target, draft, num_speculative_tokens=n, max_num_seqs=3)
            assert eng.generate(PROMPTS, greedy_params()) == refs[id(target)], n
            spec = eng.stats.spec
            assert spec.num_draft_tokens == spec.num_drafts * n
            assert len(spec.num_accepted_tokens_per_pos) == n
        # The tuned draft drafts the target's own greedy chain: every round accepts all n,
        # except rounds cut short by max_tokens (those accept what fits, never more).
        per_pos = spec.num_accepted_tokens_per_pos
        assert per_pos == sorted(per_pos, reverse=True)
        assert spec.num_accepted_tokens >= spec.num_draft_tokens - n * len(PROMPTS)


@pytest.mark.parametrize(
    ("sample_from_anchor", "n"), [(True, 2), (False, 1)], ids=["anchor-first-N2", "1+N-N1"]
)
def test_short_block_sampling_keeps_the_target_law(sample_from_anchor, n):
    from serve.engine import SamplingParams
    from tests.unit.test_engine import tv_check
    from tests.unit.test_engine_helpers import transition_matrix

    target = make_target(0, predictable=True, sharpness=30.0)
    draft = make_draft(target, sample_from_anchor, 40, tuned=True, strength=3.0, block_size=BLOCK)
    eng = make_engine(target, draft, num_speculative_tokens=n, max_num_seqs=64)
    m, k, prompt = 1200, 4, [5, 7, 9]
    params = [SamplingParams(max_tokens=k, temperature=0.8, seed=s) for s in range(m)]
    outs = torch.tensor(eng.generate([prompt] * m, params))
    tv_check(outs, prompt[-1], transition_matrix(target, 0.8))
    spec = eng.stats.spec
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens  # accept and reject both ran
    assert spec.num_draft_tokens == spec.num_drafts * n
