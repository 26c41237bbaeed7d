"""Adaptive verification as vLLM 0.34 runs it (`AdaptiveVerificationManager`,
`vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`): one draft BUDGET per batch, then the
budget's slots handed to the requests by survival.

1. Budget (`choose_draft_budget`, vLLM's `get_num_tokens`): survival a_{r,j} = prod_{i<=j} c_{r,i}
   in float64 over the scheduled slots; scores = all survivals sorted descending; for m = 0..M
   (M = min(scheduled drafts, logits room)) expected tokens E_m = S + sum of the m best scores
   (S = requests that sample this step), cost C_m = draft_cost(R) + verify_cost(m); the budget
   is the FIRST argmax of E_m / C_m over all m (a global search, unlike Algorithm 1's stop at the
   first non-improvement).
2. Allocation (`allocate_draft_budget`, vLLM's `assign_draft_token_budget` Triton kernel): the
   `budget` slots of highest float32 survival win; survival is non-increasing along a request, so
   the winners are per-request prefixes; ties at the threshold go to requests in batch order
   (`allocation_by_budget` gives the allocation of every budget from one stable sort).

Differences from vLLM, both forced by a synchronous engine:
- vLLM picks the budget on the host from the previous step's confidences (a device-to-host copy
  in flight; a request's first round reads all ones, `add_request` resets its slot) and
  allocates it on the device with the current ones. The embedded engine has the current
  confidences on the host already, so by default both steps use them (vLLM with no copy lag);
  `plan_budgeted_verify_lengths(..., budget_confidence=previous)` reproduces the lag (the
  engine's `adaptive_budget_confidence="previous"`): the budget from the previous round's
  confidences, the allocation and its padded pricing from the current ones.
- vLLM's cost is a function of the token count (varlen batch, CUDA-graph padded sizes). The
  embedded engine verifies a dense [R, q] batch padded to the longest admitted prefix, so the
  caller prices budget m by the padded width it will actually run (`PaddedCostTable`).
  `PaddedCostTable.from_vllm_tables` maps vLLM's two tables onto that layout (exact at R = 1,
  an approximation above), so both stacks can be priced alike.

Cost tables: `build_cost_table` is vLLM's `build_cost_tables_from_curves` (monotone envelope,
step function up to the capture limit, linear interpolation past it, linear extrapolation).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


def survival(confidence: torch.Tensor) -> torch.Tensor:
    """[R, N] confidences -> [R, N] float64 running products (vLLM's budget arithmetic)."""
    return torch.cumprod(confidence.double(), dim=1)


def choose_draft_budget(
    confidence: torch.Tensor,
    num_drafts: torch.Tensor,
    step_cost: torch.Tensor,
    num_sampling: int | None = None,
) -> int:
    """vLLM's draft budget for one batch.

    Args:
        confidence: [R, N] per-slot accept estimates (confidence head or acceptance estimator).
        num_drafts: [R] drafts scheduled per request (slots j >= num_drafts[r] are not eligible).
        step_cost: [M + 1] cost of a step that verifies m = 0..M drafts (draft + verify, any
            unit); M caps the budget (vLLM: min(scheduled drafts, logits room)).
        num_sampling: requests that emit a token this step (vLLM counts requests past prefill);
            default R.
    Returns:
        m in 0..min(M, eligible slots), the first maximiser of expected tokens / cost.
    """
    r, n = confidence.shape
    num_sampling = r if num_sampling is None else num_sampling
    valid = torch.arange(n, device=confidence.device) < num_drafts.view(-1, 1).to(confidence.device)
    scores = survival(confidence)[valid].sort(descending=True).values
    top = min(int(num_drafts.sum()), step_cost.numel() - 1)
    scores = scores[:top].cpu()
    expected = num_sampling + torch.cat([scores.new_zeros(1), torch.cumsum(scores, 0)])
    cost = step_cost[: top + 1].to(torch.float64).cpu()
    return int(torch.argmax(expected / cost))  # torch.argmax: first maximum, like np.argmax


def allocation_by_budget(confidence: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """[M + 1, R] int64 verify lengths for every budget m = 0..M (M = sum of num_drafts): row m
    is `allocate_draft_budget(confidence, num_drafts, m)`.

    The kernel's rule (admit every float32 survival above the m-th best, hand the ties to
    requests in batch order, a request's tied slots being consecutive steps) is the first m
    entries of a STABLE descending sort of the flattened (request, step) survivals: equal values
    keep (request, step) order. Ineligible slots (step >= num_drafts[r]) score -1 and sort last.
    """
    r, n = confidence.shape
    device = confidence.device
    num_drafts = num_drafts.to(device=device, dtype=torch.long).clamp(0, n)
    surv = torch.cumprod(confidence.float(), dim=1)  # [R, N] float32, as the kernel multiplies
    eligible = torch.arange(n, device=device) < num_drafts.view(-1, 1)
    scores = torch.where(eligible, surv, torch.full_like(surv, -1.0)).flatten()
    total = int(num_drafts.sum())
    order = scores.sort(descending=True, stable=True).indices[:total]  # [M]
    onehot = torch.nn.functional.one_hot(order // n, r)  # [M, R]
    return torch.cat([onehot.new_zeros(1, r), onehot.cumsum(0)])  # [M + 1, R]


def allocate_draft_budget(
    confidence: torch.Tensor, num_drafts: torch.Tensor, budget: int
) -> torch.Tensor:
    """Per-request verify lengths [R] int64: the `budget` best slots by float32 survival
    (vLLM's `assign_draft_token_budget`; see `allocation_by_budget`)."""
    table = allocation_by_budget(confidence, num_drafts)
    return table[min(max(budget, 0), table.shape[0] - 1)]


def build_cost_table(curve: Sequence[tuple[int, float]], limit: int, capture_limit: int = 0):
    """vLLM's `build_cost_tables_from_curves` for one curve: [limit + 1] float64 cost by size.

    curve: (size, cost) samples; the cost is made monotone (running max); a size at or below
    `capture_limit` costs its next profiled size (execution pads up to a captured size), sizes
    past it interpolate between profiled sizes past it, sizes past the last sample extrapolate
    the last slope.
    """
    xs, ys = np.asarray(curve, dtype=np.float64).T
    ys = np.maximum.accumulate(ys)
    values = np.arange(limit + 1)
    result = ys[np.minimum(np.searchsorted(xs, values, side="left"), len(xs) - 1)]
    if capture_limit:
        smooth, above = values > capture_limit, xs > capture_limit
        if smooth.any() and above.any():
            result[smooth] = np.interp(values[smooth], xs[above], ys[above])
    if len(xs) > 1:
        after = values > xs[-1]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        result[after] = ys[-1] + slope * (values[after] - xs[-1])
    return result


@dataclass
class PaddedCostTable:
    """Step costs (ms) of the embedded engine, profiled on the batches it runs.

    draft_ms[R]: one draft step for R requests (N drafts each, fixed whatever is verified);
    verify_ms[R][q]: one target forward over [R, q] queries (q = longest admitted prefix + 1),
    for R = 1..max_num_seqs and q = 1..N+1 (index 0 unused, kept so sizes index directly).
    """

    draft_ms: list[float]
    verify_ms: list[list[float]]
    meta: dict

    def step_costs(self, num_reqs: int, lengths_by_budget: torch.Tensor) -> torch.Tensor:
        """[M + 1] cost of each budget m, given the longest prefix it admits (`[M + 1]` ints)."""
        row = torch.tensor(self.verify_ms[num_reqs], dtype=torch.float64)
        return self.draft_ms[num_reqs] + row[lengths_by_budget.long().cpu() + 1]

    def save(self, path: str | Path) -> None:
        data = {"draft_ms": self.draft_ms, "verify_ms": self.verify_ms, "meta": self.meta}
        Path(path).write_text(json.dumps(data, indent=1))

    @classmethod
    def from_vllm_tables(
        cls,
        draft_table: Sequence[float] | np.ndarray,
        verify_table: Sequence[float] | np.ndarray,
        max_num_reqs: int,
        num_drafts: int,
        meta: dict | None = None,
    ) -> PaddedCostTable:
        """The padded table from vLLM 0.34's cost tables (`build_cost_tables_from_curves`:
        `draft_table[R]` a draft step for R requests, `verify_table[T]` a target forward over T
        tokens): draft_ms[R] = draft_table[R], verify_ms[R][q] = verify_table[R * q] for
        R = 1..max_num_reqs, q = 1..num_drafts + 1 (a dense [R, q] batch runs R * q tokens);
        index 0 (R or q) stays 0.0, as in the profiled layout.

        Exact at R = 1 (vLLM prices verifying q - 1 drafts of one request at q tokens, this is
        that number); an approximation above, where vLLM's varlen batch runs only the admitted
        tokens, R + budget, while the engine's padded batch runs R * q.

        Raises ValueError when a table is too short: draft_table needs max_num_reqs + 1 entries,
        verify_table max_num_reqs * (num_drafts + 1) + 1.
        """
        if max_num_reqs < 1 or num_drafts < 1:
            raise ValueError(
                f"max_num_reqs={max_num_reqs}, num_drafts={num_drafts}: both must be >= 1"
            )
        draft = np.asarray(draft_table, dtype=np.float64).reshape(-1)
        verify = np.asarray(verify_table, dtype=np.float64).reshape(-1)
        q_max = num_drafts + 1
        if len(draft) <= max_num_reqs or len(verify) <= max_num_reqs * q_max:
            raise ValueError(
                f"vLLM cost tables too short: draft_table has {len(draft)} entries (needs "
                f"{max_num_reqs + 1}: request counts 0..max_num_reqs={max_num_reqs}), "
                f"verify_table {len(verify)} (needs {max_num_reqs * q_max + 1}: token counts "
                f"0..max_num_reqs * (num_drafts + 1) = {max_num_reqs} * {q_max})"
            )
        draft_ms = [0.0] + [float(draft[r]) for r in range(1, max_num_reqs + 1)]
        verify_ms = [[0.0] * (q_max + 1)] + [
            [0.0] + [float(verify[r * q]) for q in range(1, q_max + 1)]
            for r in range(1, max_num_reqs + 1)
        ]
        info = {"source": "vllm_tables", "max_num_reqs": max_num_reqs, "num_drafts": num_drafts}
        return cls(draft_ms, verify_ms, {**info, **(meta or {})})

    @classmethod
    def load(cls, path: str | Path) -> PaddedCostTable:
        d = json.loads(Path(path).read_text())
        if "verify_ms" not in d or "draft_ms" not in d:
            raise ValueError(
                f"{path}: not a padded cost table (needs 'draft_ms' and 'verify_ms'); "
                "profile one with the engine (leave cost_table unset) or pass the policy's table"
            )
        return cls([float(x) for x in d["draft_ms"]], d["verify_ms"], d.get("meta", {}))


def plan_budgeted_verify_lengths(
    confidence: torch.Tensor,
    table: PaddedCostTable,
    num_drafts: torch.Tensor | None = None,
    *,
    budget_confidence: torch.Tensor | None = None,
) -> torch.Tensor:
    """The engine's vLLM-semantics verify lengths [R]: budget priced on the padded batch.

    confidence: [R, N] this round's confidences; they allocate every budget's slots and, through
        the longest prefix each budget admits, its padded price.
    budget_confidence: [R, N] the scores that pick the budget (`choose_draft_budget`); None =
        `confidence`. vLLM 0.34 passes the previous round's confidences here (ones for a
        request's first round): the result is then allocation(confidence)[budget chosen from
        budget_confidence].
    """
    r, n = confidence.shape
    if budget_confidence is None:
        budget_confidence = confidence
    elif tuple(budget_confidence.shape) != (r, n):
        raise ValueError(
            f"budget_confidence has shape {tuple(budget_confidence.shape)}; confidence {(r, n)}"
        )
    if num_drafts is None:
        num_drafts = torch.full((r,), n, dtype=torch.long)
    lengths = allocation_by_budget(confidence, num_drafts)  # [M + 1, R]
    cost = table.step_costs(r, lengths.max(1).values)  # priced on the padded width
    budget = choose_draft_budget(budget_confidence, num_drafts, cost)
    return lengths[budget]


def profile_padded_costs(
    draft_step: Callable[[int], object],
    verify_step: Callable[[int, int], object],
    max_num_reqs: int,
    num_drafts: int,
    *,
    warmup: int = 1,
    iters: int = 2,
    sync: Callable[[], None] | None = None,
) -> PaddedCostTable:
    """Time `draft_step(R)` and `verify_step(R, q)` (a dense [R, q] target forward) and build
    the padded cost table: measured at R = 1, 2, 4, ..., max_num_reqs and every q = 1..N+1,
    linear in R between measured sizes. Costs are made non-decreasing in q (vLLM's running
    max: timing noise must not make a wider batch look cheaper)."""
    sync = sync or _default_sync

    def ms(fn) -> float:
        for _ in range(warmup):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        return 1000.0 * (time.perf_counter() - t0) / iters

    sizes = sorted({1, max_num_reqs, *[2**i for i in range(max_num_reqs.bit_length())]})
    sizes = [s for s in sizes if s <= max_num_reqs]
    draft = {r: ms(lambda r=r: draft_step(r)) for r in sizes}
    verify = {}
    for r in sizes:
        row = [ms(lambda r=r, q=q: verify_step(r, q)) for q in range(1, num_drafts + 2)]
        verify[r] = np.maximum.accumulate(np.asarray([0.0, *row]))
    xs = np.asarray(sizes, dtype=np.float64)
    draft_ms = [0.0] + [
        float(np.interp(r, xs, [draft[s] for s in sizes])) for r in range(1, max_num_reqs + 1)
    ]
    grid = np.stack([verify[s] for s in sizes])  # [len(sizes), N + 2]
    verify_ms = [[0.0] * (num_drafts + 2)] + [
        [float(np.interp(r, xs, grid[:, q])) for q in range(num_drafts + 2)]
        for r in range(1, max_num_reqs + 1)
    ]
    meta = {"warmup": warmup, "iters": iters, "profiled_num_reqs": sizes}
    return PaddedCostTable(draft_ms, verify_ms, meta)


def _default_sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
