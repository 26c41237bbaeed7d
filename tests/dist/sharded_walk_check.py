"""Check batch-sharded sequential sampling against the replicated walk, bitwise, on every rank.

Launch either way:
    torchrun --nproc-per-node 2 tests/dist/sharded_walk_check.py --backend gloo
    torchrun --nproc-per-node 2 tests/dist/sharded_walk_check.py --backend nccl --device cuda
or in-process through `spawn_check(world_size, ...)` (what tests/dist/test_sampling_sharded.py does).

Every rank builds the same tiny models (seeded) and inputs, computes the replicated walk itself,
runs `sharded_markov_walk`, and asserts draft ids and confidences are bit-identical (confidences
only to 1e-6 relative with `--confidence gather`, see common/sampling/sharded.py), for greedy,
seeded sampling and mixed temperatures, batch sizes below, equal to and not divisible by tp,
reduced/full vocab (draft vocab not divisible by tp), and the three Markov head types.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

if __package__ in (None, ""):  # run as a file by torchrun: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.sampling.markov_walk import markov_walk  # noqa: E402
from common.sampling.sharded import all_to_all_rows, sharded_markov_walk  # noqa: E402
from tests.dist.tiny import tiny_model  # noqa: E402

MODELS = [
    dict(vocab_size=50, draft_vocab_size=37, markov_head_type="vanilla", block_size=4),
    dict(vocab_size=23, markov_head_type="gated", block_size=3, sample_from_anchor=False),
    dict(vocab_size=31, draft_vocab_size=29, markov_head_type="rnn", block_size=5),
    dict(vocab_size=19, markov_rank=0, confidence=False, block_size=3),
]


def batch_sizes(tp: int) -> list[int]:
    return sorted({1, max(tp - 1, 1), tp, tp + 1, 2 * tp + 1, 7})


def check_all_to_all(device) -> None:
    """Both all-to-all implementations deliver chunk j of rank i to rank j, identically."""
    tp, rank = dist.get_world_size(), dist.get_rank()
    send = torch.arange(tp * 3 * 2, dtype=torch.float32, device=device).view(tp, 3, 2) + 100 * rank
    a = all_to_all_rows(send, a2a="all_to_all_single")
    b = all_to_all_rows(send, a2a="all_gather")
    expect = torch.stack([send[rank] - 100 * rank + 100 * i for i in range(tp)])
    assert torch.equal(a, expect) and torch.equal(b, expect), (a, b, expect)


def run_checks(backend: str, device: str, a2a: str, confidence="recompute") -> int:
    """All cases on this rank; returns the number of cases checked (raises on a mismatch).

    confidence: a mode of `sharded_markov_walk` or a tuple of them (each mode checked)."""
    tp = dist.get_world_size()
    dev = torch.device(device)
    check_all_to_all(dev)
    modes = (confidence,) if isinstance(confidence, str) else tuple(confidence)
    n_cases = 0
    for mi, spec in enumerate(MODELS):
        model = tiny_model(seed=100 + mi, **spec).to(dev)
        cfg = model.config
        n, h = cfg.num_speculative_tokens, cfg.hidden_size
        for R in batch_sizes(tp):
            g = torch.Generator().manual_seed(1000 * mi + R)
            hidden = torch.randn(R, n, h, generator=g).to(dev)
            anchor = torch.randint(cfg.vocab_size, (R,), generator=g).to(dev)
            seeds = torch.randint(1 << 40, (R,), generator=g).to(dev)
            pos = torch.randint(1, 1000, (R,), generator=g).to(dev)
            temps = {
                "greedy": torch.zeros(R),
                "sampled": torch.full((R,), 0.8),
                "mixed": torch.tensor([0.0, 1.0, 0.5, 1.3] * R)[:R],
            }
            for name, t in temps.items():
                t = t.to(dev)
                base = model.compute_draft_logits(hidden.flatten(0, 1)).view(R, n, -1)
                ref = markov_walk(model, base, hidden, anchor, t, seeds, pos, probs="none")
                for mode in modes:
                    out = sharded_markov_walk(
                        model, hidden, anchor, t, seeds, pos, a2a=a2a, confidence=mode
                    )
                    where = f"model {mi} {spec}, R={R}, {name}, {mode}, tp={tp}"
                    assert torch.equal(out.draft_ids, ref.draft_ids), f"draft ids differ: {where}"
                    if ref.confidence is None:
                        assert out.confidence is None, where
                    elif mode == "recompute":
                        a = out.confidence.contiguous().view(torch.int32)
                        b = ref.confidence.contiguous().view(torch.int32)
                        assert torch.equal(a, b), f"confidences differ bitwise: {where}"
                    else:  # local GEMV over fewer rows: equal up to BLAS batch variance
                        torch.testing.assert_close(
                            out.confidence, ref.confidence, rtol=1e-6, atol=0
                        )
                    n_cases += 1
    return n_cases


def _worker(rank, world_size, port, backend, device, a2a, confidence) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        run_checks(backend, device, a2a, confidence)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_check(
    world_size: int, backend="gloo", device="cpu", a2a="auto", confidence="recompute"
) -> None:
    """Run the checks in `world_size` forked processes; raises if any rank fails.

    Fork, not spawn: the children inherit the imported torch, where spawn re-imports it per rank
    (seconds each on a busy 2-core machine). Each child sets one intra-op thread before any op,
    so no OpenMP pool from the parent is used after the fork.
    """
    import torch.multiprocessing as mp

    args = (world_size, free_port(), backend, device, a2a, confidence)
    mp.start_processes(_worker, args=args, nprocs=world_size, join=True, start_method="fork")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda for nccl)")
    ap.add_argument("--a2a", default="auto", choices=["auto", "all_to_all_single", "all_gather"])
    ap.add_argument("--confidence", default="recompute", choices=["recompute", "gather"])
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    rank = int(os.environ.get("LOCAL_RANK", 0))
    if device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(args.backend)
    try:
        n = run_checks(args.backend, device, args.a2a, args.confidence)
        if dist.get_rank() == 0:
            print(f"OK: {n} cases bit-identical on tp={dist.get_world_size()} ({args.backend})")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
