"""Per-step time of DSpark's sequential Markov loop: dense vs top-k candidates.

    python scripts/bench_markov.py                        # CPU: vocab 151,936 and 1,000
    python scripts/bench_markov.py --device cuda --cuda-graph   # H200: also graph-captured

Times `common.sampling.markov_walk` on a real `DSparkDraftModel` (vanilla head, rank 256, block 7,
full draft vocab; a small hidden size because only the heads run) over random base logits, for
greedy drafting (no probabilities kept) and T=1 sampling (keyed Gumbel noise + the compact
sampled-from distributions verification needs). Prints ms per Markov step (loop time / N).
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.config import MARKOV_HEAD_TYPES, DSparkConfig  # noqa: E402
from common.model import DSparkDraftModel  # noqa: E402
from common.sampling.markov_walk import markov_walk  # noqa: E402


def build(vocab: int, hidden: int, rank: int, block: int, head: str, device, dtype):
    cfg = DSparkConfig(
        vocab_size=vocab,
        target_hidden_size=64,
        target_num_hidden_layers=4,
        target_layer_ids=[1],
        mask_token_id=vocab - 1,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=2 * hidden,
        block_size=block,
        markov_rank=rank,
        markov_head_type=head,
        enable_confidence_head=True,
    )
    model = DSparkDraftModel(cfg).to(device=device, dtype=dtype).eval()
    model.confidence_head.float()  # fp32, as served
    return model


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_walk(fn, device, iters: int, warmup: int, graph: bool) -> float:
    """Median seconds per call of fn() (optionally replayed from a captured CUDA graph)."""
    if graph:
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="model dtype (default fp32 cpu, bf16 cuda)")
    ap.add_argument("--vocabs", type=int, nargs="+", default=[151_936, 1_000])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--block", type=int, default=7)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256, help="draft hidden (heads only)")
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--head", default="vanilla", choices=MARKOV_HEAD_TYPES)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cuda-graph", action="store_true", help="also time graph-captured loops")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype
        else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    )
    graphs = [False, True] if args.cuda_graph and device.type == "cuda" else [False]
    n = args.block  # anchor-first layout: N = B drafts
    print(
        f"# device={device} dtype={dtype} head={args.head} rank={args.rank} block={n} "
        f"topk={args.topk} threads={torch.get_num_threads()} torch={torch.__version__}"
    )
    print(
        f"{'vocab':>7} {'batch':>5} {'mode':>7} {'graph':>5} "
        f"{'dense ms/step':>13} {'topk ms/step':>12} {'speedup':>7}"
    )
    for vocab in args.vocabs:
        model = build(vocab, args.hidden, args.rank, args.block, args.head, device, dtype)
        for R in args.batches:
            g = torch.Generator().manual_seed(R)
            base = (torch.randn(R, n, vocab, generator=g) * 3).to(device, dtype)
            hidden = torch.randn(R, n, args.hidden, generator=g).to(device, dtype)
            anchor = torch.randint(vocab, (R,), generator=g).to(device)
            seeds = torch.randint(1 << 40, (R,), generator=g).to(device)
            pos = torch.randint(1, 4096, (R,), generator=g).to(device)
            for mode, temp in (("greedy", 0.0), ("T=1", 1.0)):
                t = torch.full((R,), temp, device=device)
                probs = "none" if temp == 0 else "compact"
                for graph in graphs:
                    res = {}
                    for k in (None, args.topk):
                        fn = partial(
                            markov_walk,
                            model,
                            base,
                            hidden,
                            anchor,
                            t,
                            seeds,
                            pos,
                            topk=k,
                            probs=probs,
                            all_greedy=temp == 0,
                        )
                        res[k] = time_walk(fn, device, args.iters, args.warmup, graph) / n * 1e3
                    d, k_ = res[None], res[args.topk]
                    print(
                        f"{vocab:>7} {R:>5} {mode:>7} {str(graph):>5} "
                        f"{d:>13.3f} {k_:>12.3f} {d / k_:>6.1f}x",
                        flush=True,
                    )
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
