"""vLLM-semantics adaptive verification against vLLM 0.34.0's own code run on CPU.

Oracle: `AdaptiveVerificationManager.get_num_tokens` (the budget), the Triton kernel behind
`assign_draft_token_budget` (the allocation, via Triton's CPU interpreter) and
`build_cost_tables_from_curves`, exec'd from the wheel (tests/vllm_oracle.py; skipped without
the files). Many random cases, with ties, zeros, ones, partly scheduled requests and requests
still prefilling: identical budgets and identical per-request verify lengths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.sampling.draft_budget import (
    PaddedCostTable,
    allocate_draft_budget,
    build_cost_table,
    choose_draft_budget,
    plan_budgeted_verify_lengths,
)
from tests import vllm_oracle

pytestmark = pytest.mark.usefixtures("torch_single_thread")


class _Buf:
    def __init__(self, a):
        self.np = a


class _ReqStates:
    def __init__(self, r, num_computed, prefill_len, n, max_reqs, max_tokens):
        self.req_id_to_index = {f"r{i}": i for i in range(r)}
        self.num_computed_tokens_np = num_computed
        self.prefill_len = _Buf(prefill_len)
        self.num_speculative_steps = n
        self.max_num_reqs = max_reqs
        self.max_num_batched_tokens = max_tokens


def random_confidence(gen: np.random.Generator, r: int, n: int) -> np.ndarray:
    kind = gen.integers(4)
    if kind == 0:  # coarse values: many exact survival ties
        c = gen.choice([0.0, 0.25, 0.5, 1.0], size=(r, n))
    elif kind == 1:
        c = np.ones((r, n))
    else:
        c = gen.random((r, n)) ** gen.choice([0.2, 1.0, 3.0])
    return c.astype(np.float32)


def random_curve(gen, top: int) -> list[tuple[int, float]]:
    sizes = sorted(set(gen.integers(1, top + 1, size=gen.integers(2, 6)).tolist()) | {1})
    cost = np.cumsum(gen.random(len(sizes)) * gen.choice([0.01, 1.0, 10.0])) + gen.random()
    if gen.random() < 0.3:  # a non-monotone profile: the table's running max must fix it
        cost = cost[::-1].copy()
    return [(int(s), float(c)) for s, c in zip(sizes, cost)]


def oracle_case(av, gen):
    r, n = int(gen.integers(1, 9)), int(gen.integers(1, 8))
    conf = random_confidence(gen, r, n)
    drafts = gen.integers(0, n + 1, size=r).astype(np.int32)
    if gen.random() < 0.7:
        drafts[:] = n
    prefill_len = gen.integers(5, 20, size=r)
    num_computed = prefill_len + 3
    prefilling = gen.random(r) < 0.2
    num_computed[prefilling] = prefill_len[prefilling] - 4  # 1 non-draft token: still prefilling
    max_tokens = r * (n + 1) + 4
    capture = int(gen.choice([0, 4, 8]))
    draft_table, verify_table = av["build_cost_tables_from_curves"](
        random_curve(gen, r), random_curve(gen, max_tokens), r, max_tokens, capture
    )
    max_total_logits = int(gen.integers(r, r * (n + 1) + 3))

    mgr = object.__new__(av["AdaptiveVerificationManager"])
    mgr.req_states = _ReqStates(r, num_computed, prefill_len, n, r, max_tokens)
    mgr.num_speculative_steps = n
    mgr.num_bonus_tokens = 1
    mgr._max_total_logits = max_total_logits
    mgr.cost_tables = (draft_table, verify_table)
    mgr._stale_confidences = [_Buf(conf.copy())]
    mgr._stale_idx = 0
    tokens = {f"r{i}": int(drafts[i]) + 1 for i in range(r)}
    draft_tokens = {f"r{i}": [0] * int(drafts[i]) for i in range(r)}
    mgr.get_num_tokens(tokens, draft_tokens)
    budget = mgr._batch_budget[2]

    lengths = torch.from_numpy(drafts.copy())
    if 0 < budget < int(drafts.sum()):
        survival = torch.empty(r * n, dtype=torch.int32)
        av["assign_draft_token_budget"](
            torch.from_numpy(conf), torch.arange(r), lengths, budget, survival
        )
    elif budget == 0:
        lengths.zero_()

    case = dict(conf=conf, drafts=drafts, num_sampling=int(r - prefilling.sum()))
    case.update(draft=draft_table[r], verify=verify_table, room=max_total_logits - r, r=r)
    return case, budget, lengths.long()


def test_budget_and_allocation_equal_vllm_on_random_cases():
    av = vllm_oracle.load("adaptive_verification")
    gen = np.random.default_rng(0)
    binding = 0
    for _ in range(150):
        case, budget, lengths = oracle_case(av, gen)
        conf, drafts = torch.from_numpy(case["conf"]), torch.from_numpy(case["drafts"])
        non_draft = case["r"]  # one non-draft token per request
        top = min(int(drafts.sum()), max(0, case["room"]))
        step_cost = case["draft"] + torch.from_numpy(
            case["verify"][non_draft : non_draft + top + 1]
        )
        ours = choose_draft_budget(conf, drafts, step_cost, case["num_sampling"])
        assert ours == budget, case
        assert torch.equal(allocate_draft_budget(conf, drafts, ours), lengths), case
        binding += 0 < budget < int(drafts.sum())
    assert binding > 25  # the allocation kernel really ran on many cases


def test_allocation_equals_vllm_kernel_at_every_budget():
    av = vllm_oracle.load("adaptive_verification")
    gen = np.random.default_rng(1)
    for _ in range(15):
        r, n = int(gen.integers(1, 7)), int(gen.integers(1, 6))
        conf = random_confidence(gen, r, n)
        drafts = gen.integers(0, n + 1, size=r).astype(np.int32)
        for budget in range(1, int(drafts.sum())):
            got = torch.from_numpy(drafts.copy())
            surv = torch.empty(r * n, dtype=torch.int32)
            av["assign_draft_token_budget"](
                torch.from_numpy(conf), torch.arange(r), got, budget, surv
            )
            ours = allocate_draft_budget(torch.from_numpy(conf), torch.from_numpy(drafts), budget)
            assert torch.equal(ours, got.long()), (conf, drafts, budget)
            assert int(ours.sum()) == budget


def test_cost_table_equals_vllm():
    av = vllm_oracle.load("adaptive_verification")
    gen = np.random.default_rng(2)
    for _ in range(100):
        top, capture = int(gen.integers(2, 64)), int(gen.choice([0, 4, 16]))
        draft_curve, verify_curve = random_curve(gen, top), random_curve(gen, top)
        ref_draft, ref_verify = av["build_cost_tables_from_curves"](
            draft_curve, verify_curve, top, top, capture
        )
        np.testing.assert_array_equal(
            np.maximum(build_cost_table(verify_curve, top, capture), 1e-6), ref_verify
        )
        np.testing.assert_array_equal(
            np.maximum(build_cost_table(draft_curve, top, capture), 0.0), ref_draft
        )


# ------------------------------------------------------------------ no oracle needed
def test_budget_is_a_global_argmax_unlike_algorithm_1():
    # Expected/cost dips after the first draft, then rises: vLLM's global argmax takes all four,
    # Algorithm 1 would stop at the first non-improvement.
    conf = torch.tensor([[0.9, 1.0, 1.0, 1.0]])
    cost = torch.tensor([1.0, 1.0, 1.9, 1.9, 1.9], dtype=torch.float64)  # m = 0..4
    assert choose_draft_budget(conf, torch.tensor([4]), cost) == 4
    from common.sampling.adaptive import SPSTable, plan_verify_lengths

    sps = SPSTable([1, 2, 3, 4, 5], [1.0 / float(c) for c in cost])
    assert int(plan_verify_lengths(conf, sps).verify_len[0]) == 1


def test_padded_cost_prices_the_longest_prefix():
    # Two requests, N = 3, draft step 10 ms; a dense [2, q] verify costs q ms up to q = 3 and
    # 10 ms at q = 4. Survivals: r0 .9 .81 .729, r1 .9 .09 .009. Budget m -> lengths, q, ratio:
    # 2 -> [1, 1], 2, 3.8/12 = .317; 3 -> [2, 1], 3, 4.61/13 = .355; 4 -> [3, 1], 4, 5.339/20.
    table = PaddedCostTable([10.0] * 3, [[0.0, 1.0, 2.0, 3.0, 10.0]] * 3, {})
    conf = torch.tensor([[0.9, 0.9, 0.9], [0.9, 0.1, 0.1]])
    assert plan_budgeted_verify_lengths(conf, table).tolist() == [2, 1]
    flat = PaddedCostTable([10.0] * 3, [[1.0] * 5] * 3, {})
    assert plan_budgeted_verify_lengths(conf, flat).tolist() == [3, 3]
