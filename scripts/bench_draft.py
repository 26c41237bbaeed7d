"""Benchmark one DSpark draft training step: time and peak memory of `forward_train` (+ backward).

    python scripts/bench_draft.py                       # tiny CPU smoke (seconds)
    python scripts/bench_draft.py --device cuda --dtype bfloat16 --hidden 4096 --layers 5 \\
        --anchors 512 --block 7 --seq 4096              # Qwen3-8B draft size on one H200

Rows (each: warm-up, then timed iterations; grads reset to None every iteration so they count):
- `forward_train fwd`         no-grad forward over all anchor blocks (one backbone pass);
- `forward_train fwd+bwd`     backward target = hidden.float().sum() (no loss, no logits);
- `+ block_logits fwd+bwd`    adds the unchunked `block_logits` ([h; u] @ [lm_head | markov_w2].T)
                              at `--vocab` (keep it small: the real loss chunks the vocab).
Peak memory: CUDA `max_memory_allocated` above the pre-row baseline. CPU: peak RSS above the
pre-row RSS, sampled every millisecond by a thread (tracemalloc cannot see torch's allocator); on
glibc the mmap threshold is pinned so freed tensors leave RSS and each row's baseline is honest.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.config import MARKOV_HEAD_TYPES, DSparkConfig  # noqa: E402
from common.model import DSparkDraftModel  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MIB = 2**20


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hidden", type=int, default=128, help="draft hidden size H")
    ap.add_argument("--layers", type=int, default=2, help="draft decoder layers")
    ap.add_argument("--head-dim", type=int, default=None, help="default min(128, H/4)")
    ap.add_argument("--heads", type=int, default=None, help="default H / head_dim")
    ap.add_argument("--kv-heads", type=int, default=None, help="default max(1, heads / 4)")
    ap.add_argument("--intermediate", type=int, default=None, help="default 3 H (Qwen3-8B)")
    ap.add_argument("--target-hidden", type=int, default=None, help="default H")
    ap.add_argument("--target-layers", type=int, default=5, help="captured target layers L")
    ap.add_argument("--vocab", type=int, default=1024, help="target = draft vocab for the test")
    ap.add_argument("--markov-rank", type=int, default=32)
    ap.add_argument("--markov-head", default="vanilla", choices=MARKOV_HEAD_TYPES)
    ap.add_argument("--block", type=int, default=7, help="block size B")
    ap.add_argument("--anchors", type=int, default=32, help="anchor blocks per sequence A")
    ap.add_argument("--seq", type=int, default=256, help="sequence length T")
    ap.add_argument("--batch", type=int, default=1, help="sequences per step N")
    ap.add_argument("--layout", default="anchor", choices=["anchor", "1+N"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def build_config(a: argparse.Namespace) -> DSparkConfig:
    head_dim = a.head_dim or min(128, a.hidden // 4)
    heads = a.heads or a.hidden // head_dim
    n_target = a.target_layers * 2 + 4  # any target deep enough for L distinct non-final ids
    return DSparkConfig(
        vocab_size=a.vocab,
        target_hidden_size=a.target_hidden or a.hidden,
        target_num_hidden_layers=n_target,
        target_layer_ids=list(range(1, 2 * a.target_layers, 2)),
        mask_token_id=a.vocab - 1,
        hidden_size=a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=heads,
        num_key_value_heads=a.kv_heads or max(1, heads // 4),
        head_dim=head_dim,
        intermediate_size=a.intermediate or 3 * a.hidden,
        max_position_embeddings=max(a.seq + a.block, 4096),
        block_size=a.block,
        markov_rank=a.markov_rank,
        markov_head_type=a.markov_head,
        enable_confidence_head=a.markov_rank > 0,
        confidence_head_with_markov=a.markov_rank > 0,
        sample_from_anchor=a.layout == "anchor",
    )


def build_inputs(cfg: DSparkConfig, a: argparse.Namespace, device, dtype):
    gen = torch.Generator().manual_seed(a.seed)
    n, t = a.batch, a.seq
    if a.anchors > t - 1:
        raise SystemExit(
            f"--anchors {a.anchors} > --seq - 1 = {t - 1}: not enough anchor positions"
        )
    ctx = torch.randn(n, t, cfg.fc_input_size, generator=gen).to(device, dtype)  # [N, T, L*Ht]
    ids = torch.randint(0, cfg.vocab_size - 1, (n, t), generator=gen).to(device)  # [N, T]
    anchors = torch.stack([torch.randperm(t - 1, generator=gen)[: a.anchors] for _ in range(n)])
    anchors = anchors.sort(-1).values.to(device)  # [N, A]
    valid = torch.ones_like(anchors, dtype=torch.bool)
    return ctx, ids, anchors, valid


# ---------------------------------------------------------------- memory probes
def _pin_malloc_mmap_threshold(nbytes: int = 1 << 16) -> None:
    """glibc raises its mmap threshold after frees, keeping big freed blocks in RSS; a fixed
    threshold returns them to the OS so RSS follows live tensors. Best effort, Linux only."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: peak RSS so far (a coarser upper bound)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssPeak:
    """Peak RSS above the value at `__enter__`, sampled by a background thread."""

    def __enter__(self):
        self.base = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def delta(self) -> int:
        return self.peak - self.base


class CudaPeak:
    def __init__(self, device):
        self.device = device

    def __enter__(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize(self.device)
        self.delta = torch.cuda.max_memory_allocated(self.device) - self.base


# ---------------------------------------------------------------- timing
def measure(step, model, device, warmup: int, iters: int) -> dict:
    cuda = torch.device(device).type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    times = []
    with CudaPeak(device) if cuda else RssPeak() as mem:
        for i in range(warmup + iters):
            model.zero_grad(set_to_none=True)
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return {
        "mean_ms": 1e3 * statistics.fmean(times),
        "min_ms": 1e3 * min(times),
        "peak_mib": mem.delta / MIB,
    }


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device, dtype = torch.device(a.device), DTYPES[a.dtype]
    if device.type == "cpu":
        _pin_malloc_mmap_threshold()
    torch.manual_seed(a.seed)
    cfg = build_config(a)
    model = DSparkDraftModel(cfg).to(device, dtype).train()
    inputs = build_inputs(cfg, a, device, dtype)

    def fwd():
        with torch.no_grad():
            model.forward_train(*inputs)

    def fwd_bwd():
        model.forward_train(*inputs).hidden.float().sum().backward()

    def fwd_bwd_logits():
        out = model.forward_train(*inputs)
        model.block_logits(out.hidden, out.markov_input).float().sum().backward()

    rows = [
        ("forward_train fwd", fwd),
        ("forward_train fwd+bwd", fwd_bwd),
        (f"+ block_logits fwd+bwd (V={cfg.draft_vocab})", fwd_bwd_logits),
    ]
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_blocks = a.batch * a.anchors
    print(
        f"device={device} dtype={a.dtype} threads={torch.get_num_threads()} | "
        f"draft H={cfg.hidden_size} layers={cfg.num_hidden_layers} "
        f"heads={cfg.num_attention_heads}/{cfg.num_key_value_heads}x{cfg.head_dim} "
        f"I={cfg.intermediate_size} r={cfg.markov_rank} ({cfg.markov_head_type}) "
        f"fc_in={cfg.fc_input_size} | params {n_params / 1e6:.2f}M "
        f"({n_train / 1e6:.2f}M trainable)"
    )
    print(
        f"batch N={a.batch} seq T={a.seq} anchors A={a.anchors} block B={a.block} "
        f"layout={a.layout} -> {n_blocks * a.block} block queries x "
        f"{a.seq + a.anchors * a.block} keys per sequence; warmup {a.warmup}, timed {a.iters}"
    )
    header = (
        f"| {'part':<34} | {'mean ms':>9} | {'min ms':>9} | {'peak MiB':>9} | {'blocks/s':>9} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, step in rows:
        r = measure(step, model, device, a.warmup, a.iters)
        print(
            f"| {name:<34} | {r['mean_ms']:>9.2f} | {r['min_ms']:>9.2f} | {r['peak_mib']:>9.1f} | "
            f"{n_blocks / (r['mean_ms'] / 1e3):>9.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
