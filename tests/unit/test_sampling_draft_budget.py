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


# ------------------------------------------------------------------ vLLM's tables, vLLM's lag
def test_from_vllm_tables_prices_a_dense_batch_by_its_token_count():
    draft_table = 0.5 + 1.5 * np.arange(8)  # [R] ms, R = 0..7
    verify_table = 1.0 + np.arange(40) ** 1.3  # [T] ms, T = 0..39: every entry distinct
    table = PaddedCostTable.from_vllm_tables(draft_table, verify_table, 3, 4, meta={"gpu": "x"})
    assert len(table.draft_ms) == 4 and [len(row) for row in table.verify_ms] == [6] * 4
    assert table.draft_ms == [0.0, 2.0, 3.5, 5.0] and table.verify_ms[0] == [0.0] * 6
    for q in range(1, 6):  # R = 1: exactly vLLM's price of verifying q - 1 drafts
        assert table.verify_ms[1][q] == verify_table[q]
    for r in (2, 3):  # R > 1: the padded [R, q] batch runs R * q tokens
        assert table.verify_ms[r] == [0.0] + [verify_table[r * q] for q in range(1, 6)]
    assert table.meta["gpu"] == "x" and table.meta["num_drafts"] == 4
    # The smallest tables that cover R = 3, N = 4: 4 request counts, token counts 0..15.
    PaddedCostTable.from_vllm_tables(draft_table[:4], verify_table[:16], 3, 4)
    with pytest.raises(ValueError, match=r"draft_table has 3 entries \(needs 4"):
        PaddedCostTable.from_vllm_tables(draft_table[:3], verify_table, 3, 4)
    with pytest.raises(ValueError, match=r"verify_table 15 \(needs 16"):
        PaddedCostTable.from_vllm_tables(draft_table, verify_table[:15], 3, 4)


def test_from_vllm_tables_gives_vllms_budget_for_one_request():
    """R = 1, one non-draft token: vLLM prices budget m at draft[1] + verify[1 + m], the padded
    table at draft_ms[1] + verify_ms[1][m + 1]: the same numbers, so the same budget."""
    gen = np.random.default_rng(3)
    for _ in range(50):
        n = int(gen.integers(1, 8))
        draft = build_cost_table(random_curve(gen, 4), 4)
        verify = build_cost_table(random_curve(gen, 4 * (n + 1)), 4 * (n + 1))
        table = PaddedCostTable.from_vllm_tables(draft, verify, 4, n)
        conf = torch.from_numpy(random_confidence(gen, 1, n))
        vllm_cost = torch.from_numpy(draft[1] + verify[1 : n + 2])
        budget = choose_draft_budget(conf, torch.tensor([n]), vllm_cost)
        assert plan_budgeted_verify_lengths(conf, table).tolist() == [budget]


def naive_lagged_plan(current, previous, draft_ms, verify_row) -> list[int]:
    """The lagged plan in plain Python: allocation of every budget m by float32 survival of the
    CURRENT confidences (a stable descending sort of (request, step) slots), each budget priced
    draft + verify[longest prefix + 1], the budget the FIRST argmax of E_m / C_m with E_m from the
    PREVIOUS confidences' float64 survivals."""
    r, n = len(current), len(current[0])
    slots = []
    for i in range(r):
        s = np.float32(1.0)
        for j in range(n):
            s = np.float32(s * np.float32(current[i][j]))
            slots.append((-float(s), i * n + j, i))
    winners = [i for _, _, i in sorted(slots)]
    scores = []
    for i in range(r):
        s = 1.0
        for j in range(n):
            s *= float(np.float32(previous[i][j]))
            scores.append(s)
    scores.sort(reverse=True)
    best, best_m = None, 0
    for m in range(r * n + 1):
        lengths = [winners[:m].count(i) for i in range(r)]
        ratio = (r + sum(scores[:m])) / (draft_ms + verify_row[max(lengths) + 1])
        if best is None or ratio > best:
            best, best_m = ratio, m
    return [winners[:best_m].count(i) for i in range(r)]


def test_budget_confidence_picks_the_budget_the_current_one_allocates_it():
    # Current survivals: r0 .9 .81 .729, r1 .9 .09 .009; draft 10 ms, verify [2, q] q ms up to
    # q = 3 and 10 ms at q = 4 (test_padded_cost_prices_the_longest_prefix): budget 3, [2, 1].
    # Budget m -> current allocation, cost: 0 [0,0] 11; 1 [1,0] 12; 2 [1,1] 12; 3 [2,1] 13;
    # 4 [3,1] 20; 5 [3,2] 20; 6 [3,3] 20.
    table = PaddedCostTable([10.0] * 3, [[0.0, 1.0, 2.0, 3.0, 10.0]] * 3, {})
    conf = torch.tensor([[0.9, 0.9, 0.9], [0.9, 0.1, 0.1]])
    assert plan_budgeted_verify_lengths(conf, table).tolist() == [2, 1]
    assert plan_budgeted_verify_lengths(conf, table, budget_confidence=conf).tolist() == [2, 1]
    # All-ones previous (a first round): E_m = 2 + m, best at m = 6 (8/20 > 5/13).
    ones = torch.ones(2, 3)
    assert plan_budgeted_verify_lengths(conf, table, budget_confidence=ones).tolist() == [3, 3]
    # Low previous survivals .2 .02 .002 each: E/C = 2/11, 2.2/12, 2.4/12, 2.42/13 ... -> m = 2,
    # allocated by the CURRENT survivals as [1, 1] (not the previous ones' own allocation).
    low = torch.tensor([[0.2, 0.1, 0.1], [0.2, 0.1, 0.1]])
    assert plan_budgeted_verify_lengths(conf, table, budget_confidence=low).tolist() == [1, 1]
    for prev in (ones, low):
        assert plan_budgeted_verify_lengths(
            conf, table, budget_confidence=prev
        ).tolist() == naive_lagged_plan(conf.tolist(), prev.tolist(), 10.0, table.verify_ms[2])
    with pytest.raises(ValueError, match="budget_confidence has shape"):
        plan_budgeted_verify_lengths(conf, table, budget_confidence=ones[:1])


def test_budget_confidence_equals_a_naive_loop_on_random_cases():
    gen = np.random.default_rng(4)
    differs = 0
    for _ in range(200):
        r, n = int(gen.integers(1, 5)), int(gen.integers(1, 5))
        conf = torch.from_numpy(random_confidence(gen, r, n))
        prev = torch.from_numpy(random_confidence(gen, r, n))
        verify = np.maximum.accumulate(gen.random(n + 2) * gen.choice([0.1, 1.0, 10.0]))
        draft = float(gen.random() * 3)
        table = PaddedCostTable([draft] * (r + 1), [[0.0, *verify[1:].tolist()]] * (r + 1), {})
        got = plan_budgeted_verify_lengths(conf, table, budget_confidence=prev).tolist()
        assert got == naive_lagged_plan(conf.tolist(), prev.tolist(), draft, table.verify_ms[r])
        differs += got != plan_budgeted_verify_lengths(conf, table).tolist()
    assert differs > 20  # the lag really changed many plans
