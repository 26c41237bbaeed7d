"""Time one inference draft step, split into the parallel backbone pass and the Markov loop.

    python scripts/bench_draft_step.py                                   # tiny CPU sizes
    python scripts/bench_draft_step.py --device cuda --hidden 4096 --layers 5 --vocab 151936 \
        --ctx 1024 --batches 1 8 64                                      # Qwen3-8B draft, H200

Backbone = `backbone` over `[anchor, MASK x (B-1)]` against cached context K/V of `--ctx` tokens
+ `compute_draft_logits` for the N slots; Markov = `common.sampling.markov_walk` (greedy) over
those base logits. On CUDA both are also timed as captured CUDA graphs (static shapes). Prints a
table with the Markov loop's share of the step, measured in one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.config import DSparkConfig  # noqa: E402
from common.model import DSparkDraftModel, inference_block_mask  # noqa: E402
from common.sampling import markov_walk  # noqa: E402


def timed(fn, device, iters: int, graph: bool) -> float:
    """Mean ms of fn() (after warm-up), optionally replayed from a captured CUDA graph."""
    cuda = device.type == "cuda"
    for _ in range(3):
        fn()
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / iters


def bench_batch(model, a, r: int, dev, dtype) -> None:
    """Print the table rows of batch size r."""
    cfg = model.config
    n, b = cfg.num_speculative_tokens, cfg.block_size
    with torch.no_grad():
        ctx = torch.randn(r, a.ctx, cfg.fc_input_size, device=dev, dtype=dtype)
        pos = torch.arange(a.ctx, device=dev).expand(r, -1)
        kv = model.context_kv(ctx, pos)
    anchor = torch.randint(0, a.vocab - 1, (r,), device=dev)
    blk_ids = model.block_input_ids(anchor)
    blk_pos = a.ctx + torch.arange(b, device=dev).expand(r, -1)
    mask = inference_block_mask(torch.full((r,), a.ctx, device=dev), a.ctx, b)
    out = {}

    @torch.no_grad()
    def backbone():
        h = model.backbone(blk_ids, blk_pos, kv, mask)[:, :n]
        out["h"] = h
        out["u"] = model.compute_draft_logits(h.reshape(r * n, -1)).view(r, n, -1)

    backbone()
    temp = torch.zeros(r, device=dev)
    seeds = torch.zeros(r, dtype=torch.long, device=dev)

    @torch.no_grad()
    def markov():
        markov_walk(
            model,
            out["u"],
            out["h"],
            anchor,
            temp,
            seeds,
            blk_pos[:, 0] + 1,
            probs="none",
            all_greedy=True,
        )

    for graph in [False, True] if dev.type == "cuda" else [False]:
        tb = timed(backbone, dev, a.iters, graph)
        tm = timed(markov, dev, a.iters, graph)
        print(f"{r:>5} {str(graph):>5} {tb:>12.3f} {tm:>10.3f} {tm / (tb + tm):>11.1%}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--block", type=int, default=7)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    hd = 128 if a.hidden >= 1024 else 32
    cfg = DSparkConfig(
        vocab_size=a.vocab,
        target_hidden_size=a.hidden,
        target_num_hidden_layers=36,
        target_layer_ids=[1, 9, 17, 25, 33],
        mask_token_id=a.vocab - 1,
        hidden_size=a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=a.hidden // hd,
        num_key_value_heads=max(1, a.hidden // hd // 4),
        head_dim=hd,
        intermediate_size=3 * a.hidden,
        block_size=a.block,
        markov_rank=a.rank,
    )
    torch.manual_seed(0)
    with torch.device(dev):
        model = DSparkDraftModel(cfg).to(dtype).eval()
    b = cfg.block_size
    print(
        f"# device={dev} dtype={dtype} H={a.hidden} layers={a.layers} vocab={a.vocab} "
        f"rank={a.rank} block={b} ctx={a.ctx} torch={torch.__version__}"
    )
    print(f"{'batch':>5} {'graph':>5} {'backbone ms':>12} {'markov ms':>10} {'markov share':>12}")
    for r in a.batches:
        bench_batch(model, a, r, dev, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
