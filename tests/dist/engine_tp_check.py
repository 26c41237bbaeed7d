"""The engine with batch-sharded sampling (`EngineOptions.tp`) against the same engine on one
process: every rank's outputs and spec-decode counters bit-identical to tp=1's.

Launch either way:
    torchrun --nproc-per-node 2 tests/dist/engine_tp_check.py
or in-process through `spawn_engine_check(world_size)` (tests/dist/test_engine_tp.py does, on gloo).

Every rank builds the same tiny float64 models (seeded), runs the tp engine (collectives inside)
and, itself, a tp=1 engine on the same requests: sampled and mixed temperatures, probabilistic
and greedy drafting (its argmax walk stays replicated), full and reduced draft vocab, adaptive verification from a saved cost table,
more requests than slots (continuous batching). It also asserts that sampled rounds really ran
sharded, and that a top-k draft stays replicated (vLLM's precondition) with the same outputs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

if __package__ in (None, ""):  # run as a file by torchrun: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.sampling.draft_budget import PaddedCostTable  # noqa: E402
from serve.engine import Engine, EngineOptions, SamplingParams  # noqa: E402
from tests.dist.sharded_walk_check import free_port  # noqa: E402
from tests.unit.test_engine_helpers import make_draft, make_target  # noqa: E402

PROMPTS = [[5, 7, 9], [11, 12, 13, 14, 15, 16, 17, 18, 19], [20], [30, 31, 32, 33, 34], [40, 41]]
MAX_TOKENS = [13, 9, 17, 12, 15]
CASES = [
    dict(draft_vocab=None, draft_sampling="probabilistic", temps=[1.0] * 5),
    dict(draft_vocab=40, draft_sampling="probabilistic", temps=[0.0, 1.0, 0.5, 1.3, 0.0]),
    dict(draft_vocab=40, draft_sampling="greedy", temps=[0.8] * 5),
    dict(draft_vocab=None, draft_sampling="probabilistic", temps=[1.0] * 5, adaptive=True),
]


def make_engine(target, draft, tp: int, cost: str | None, **kw) -> Engine:
    opts = EngineOptions(
        target="<memory>",
        checkpoint="<memory>",
        dtype="float64",
        max_model_len=96,
        max_num_seqs=3,
        tp=tp,
        cost_table=cost,
        **kw,
    )
    return Engine(target, draft, opts, eos_token_ids=[])


def run_checks(workdir: Path) -> int:
    tp, rank = dist.get_world_size(), dist.get_rank()
    cost = workdir / f"cost-{rank}.json"
    rows = [[0.0] + [2.0 + q for q in range(1, 6)] for _ in range(4)]
    PaddedCostTable([1.0] * 4, rows, {}).save(cost)
    target = make_target(2)
    n = 0
    for i, case in enumerate(CASES):
        draft = make_draft(target, True, case["draft_vocab"], seed=10 + i, strength=2.0)
        adaptive = case.get("adaptive", False)
        kw = dict(draft_sampling=case["draft_sampling"], adaptive_verification=adaptive)
        params = [
            SamplingParams(max_tokens=m, temperature=t, seed=100 * i + j)
            for j, (m, t) in enumerate(zip(MAX_TOKENS, case["temps"], strict=True))
        ]
        sharded = make_engine(target, draft, tp, str(cost) if adaptive else None, **kw)
        assert sharded.sampler.group is not None, f"case {i}: sampling not sharded"
        got = sharded.generate(PROMPTS, params)
        ref_eng = make_engine(target, draft, 1, str(cost) if adaptive else None, **kw)
        ref = ref_eng.generate(PROMPTS, params)
        where = f"case {i} {case}, rank {rank}/{tp}"
        assert got == ref, f"outputs differ: {where}\n{got}\n{ref}"
        a, b = sharded.stats.spec, ref_eng.stats.spec
        assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (
            b.num_drafts,
            b.num_draft_tokens,
            b.num_accepted_tokens,
        ), where
        assert a.num_accepted_tokens_per_pos == b.num_accepted_tokens_per_pos, where
        # Argmax walks (greedy drafting) stay replicated; sampled walks must have run sharded.
        if case["draft_sampling"] == "greedy":
            assert sharded.sampler.sharded_rounds == 0, where
        else:
            assert sharded.sampler.sharded_rounds > 0, f"no round ran sharded: {where}"
        n += 1
    # vLLM keeps top-k Markov sampling replicated: same engine, a log line, same outputs.
    draft = make_draft(target, True, None, seed=3)
    draft.config.dspark_draft_topk = 5
    params = [
        SamplingParams(max_tokens=m, temperature=1.0, seed=j) for j, m in enumerate(MAX_TOKENS)
    ]
    topk = make_engine(target, draft, tp, None)
    assert topk.sampler.group is None
    assert topk.generate(PROMPTS, params) == make_engine(target, draft, 1, None).generate(
        PROMPTS, params
    )
    return n + 1


def _worker(rank, world_size, port, workdir) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        run_checks(Path(workdir))
    finally:
        dist.destroy_process_group()


def spawn_engine_check(world_size: int, workdir: str) -> None:
    """Run the checks in `world_size` forked gloo processes; raises if any rank fails."""
    import torch.multiprocessing as mp

    args = (world_size, free_port(), workdir)
    mp.start_processes(_worker, args=args, nprocs=world_size, join=True, start_method="fork")


def main() -> int:
    import tempfile

    dist.init_process_group("gloo")
    try:
        with tempfile.TemporaryDirectory() as d:
            n = run_checks(Path(d))
        if dist.get_rank() == 0:
            print(f"OK: {n} engine cases bit-identical to tp=1 on tp={dist.get_world_size()}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
