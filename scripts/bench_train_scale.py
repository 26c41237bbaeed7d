"""The real trainer step at a real target's shape, random weights (no download): tokens/s, peak
memory, the step split, MFU. `python scripts/bench_train.py step8b` runs it (see that file).

    python scripts/bench_train.py --json out.json step8b                      # Qwen3-8B, H200
    python scripts/bench_train.py step8b --shape smollm2_135m                 # SmolLM2-135M
    python scripts/bench_train.py step8b --shape tiny --device cpu --steps 1  # CPU plumbing

What runs: `train.loop.trainer.Trainer.train_step`, the step `python -m train.distill` runs (target
capture, anchors, `DistillObjective` = draft forward + `train.loop.loss.distill_loss`, backward,
clip,
AdamW), built as `train.distill.run` builds it, except that
- the target is built from a config in memory (`AutoModelForCausalLM.from_config` on the meta
  device, `to_empty` on the GPU, normal(0, 0.02) weights, unit norms, rotary tables rebuilt);
- the data are random ids packed into `seq_len` rows of documents of 256-2048 tokens, the first
  ~30% of each document (the "prompt") unsupervised; the draft vocabulary map comes from
  Zipf-like synthetic counts.
The phases are timed with CUDA events (synchronised timers on CPU) around the trainer's own
collaborators (`instrument`) and `train.loop.phases` marks in the objective and the loss.

One row per variant (all in one process, the same target; a distributed variant runs in a
`torchrun --nproc-per-node 1` child): see VARIANTS. A variant name may add Hydra overrides after
`+`, e.g. `fused_flex+trainer.micro_batch_size=64`.

Model FLOPs per step (recomputation not counted; P = weights of the linear layers):
    target forward:  2 * P_t * tokens + 4 * L_t * (n_h * d_h) * sum_docs T_d (T_d + 1) / 2
    teacher logits:  2 * V * H_t * U                  (U = the distinct label-1 positions of the
                                                       M supervised draft rows; M with
                                                       loss.share_teacher=false)
    draft fwd+bwd:   6 * P_d * A * B                  (backbone on the A blocks of B tokens)
                   + 6 * P_ctx * tokens               (fc and every layer's k/v on the context)
                   + 3 * 4 * L_d * (n_h * d_h) * K    (K = sum over block queries of visible keys)
    draft head:      4 * V_d * H * M + 6 * V_d * r * M (frozen lm_head: forward + input grad)
MFU = FLOPs / step time / peak, against the H200's spec dense bf16 peak (989 TFLOP/s) and the
8192^3 bf16 matmul rate measured in the same run.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

SPEC_PEAK_FLOPS = 989e12  # H200 dense bf16

SHAPES = {
    "qwen3_8b": {
        "family": "qwen3",
        "target": dict(
            vocab_size=151_936,
            hidden_size=4096,
            intermediate_size=12_288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40_960,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
        # The recipe's micro batch (4 x 4096 tokens); one micro-batch per optimizer step here
        # (the recipe accumulates 16: its optimizer share is 1/16 of the one measured).
        "overrides": [
            "+experiment=qwen3_8b_dspark",
            "draft.draft_vocab_size=32768",
            "trainer.grad_accum=1",
        ],
        "variants": [
            "checkpoint_loss",
            "fused_loss",
            "fused_flex",
            "fused_flex_tflex",
            "fused_flex_tflex_compile",
            "fused_flex_tflex_compile_tcompile",
            "fused_flex_tflex_compile_tcompile+loss.share_teacher=false",
            "fused_flex_tflex_compile_tcompile_lcompile",
            "fsdp",
        ],
    },
    "qwen25_coder_1p5b": {
        "family": "qwen2",
        "target": dict(
            vocab_size=151_936,
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            max_position_embeddings=32_768,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
        # The 1.5B recipe's draft: 3 layers, a 32k draft vocabulary, 7 drafts a round; rows of
        # 4,096 tokens, one micro-batch per optimizer step.
        "overrides": [
            "+experiment=qwen3_8b_dspark",
            "draft.num_hidden_layers=3",
            "draft.target_layer_ids=null",
            "draft.draft_vocab_size=32768",
            "draft.mask_token_id=151646",
            "trainer.grad_accum=1",
            "trainer.micro_batch_size=8",
        ],
        "variants": [
            "fused_loss",
            "fused_flex_tflex",
            "fused_flex_tflex_compile_tcompile",
            "fused_flex_tflex_compile_tcompile+trainer.micro_batch_size=16",
        ],
    },
    "smollm2_135m": {
        "family": "llama",
        "target": dict(
            vocab_size=49_152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            max_position_embeddings=8192,
            rope_theta=100_000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
        "overrides": [
            "+experiment=small_gpu",
            "draft.draft_vocab_size=8192",
            "draft.mask_token_id=49151",
            "draft.mask_token=null",
        ],
        "variants": [
            "checkpoint_loss",
            "fused_loss",
            "fused_flex",
            "fused_flex_tflex",
            "fused_flex_tflex+loss.chunk_tokens=8192",
            # Host-bound at 16 x 1024 tokens (kernel launches do not grow with the batch):
            "fused_flex_tflex+loss.chunk_tokens=8192+trainer.micro_batch_size=64",
            "fused_flex_tflex_compile+loss.chunk_tokens=8192+trainer.micro_batch_size=64",
            "fused_flex_tflex_compile_tcompile+loss.chunk_tokens=8192+trainer.micro_batch_size=64",
            "fused_flex_tflex_compile_tcompile+loss.chunk_tokens=8192+trainer.micro_batch_size=64"
            "+loss.share_teacher=false",
            "fused_flex_tflex_compile_tcompile_lcompile+loss.chunk_tokens=8192"
            "+trainer.micro_batch_size=64",
        ],
    },
    "tiny": {  # CPU plumbing test
        "family": "qwen3",
        "target": dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=1024,
            rope_theta=10_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
        "overrides": [
            "+experiment=tiny",
            "draft.num_hidden_layers=1",
            "draft.markov_rank=16",
            "draft.draft_vocab_size=256",
            "draft.mask_token_id=511",
            "draft.mask_token=null",
            "data.seq_len=128",
            "trainer.micro_batch_size=2",
            "trainer.num_anchors=16",
            "trainer.threads=null",
        ],
        "variants": ["checkpoint_loss", "fused_loss"],
    },
}


@contextlib.contextmanager
def vocab_grad_mode(mode: str):
    """The training objective's loss with `vocab_grad=mode`: the product always trains "fused";
    this benchmark measures the autograd alternative against it."""
    import train.loop.objective as objective

    real = objective.distill_loss
    objective.distill_loss = functools.partial(real, vocab_grad=mode)
    try:
        yield
    finally:
        objective.distill_loss = real


# Each variant changes the defaults below (the trainer's own defaults), one flag at a time:
#   vocab_grad       train.loop.vocab_loss: "fused" (closed-form gradient) | "checkpoint" (autograd,
#                    recomputed in the backward; the code before this benchmark)
#   attention        trainer.draft_attention: "sdpa" (dense boolean mask) | "flex" (BlockMask)
#   target_attention trainer.target_attention: "sdpa" (dense document-causal mask) | "flex"
#   compile_draft    trainer.compile_draft: torch.compile each draft layer
#   compile_target   trainer.compile_target: torch.compile each target decoder layer
#   compile_loss     trainer.compile_loss: torch.compile the fused loss's per-chunk passes
# (the last five are trainer settings, applied as `train.distill` applies them: by
# train.loop.target.apply_speed_settings, the loss's by DistillObjective)
#   distributed      trainer.distributed (fsdp runs in a torchrun child)
VARIANT_DEFAULTS = dict(
    vocab_grad="fused",
    attention="sdpa",
    target_attention="sdpa",
    compile_draft=False,
    compile_target=False,
    compile_loss=False,
    distributed="none",
)
VARIANTS = {
    "checkpoint_loss": dict(vocab_grad="checkpoint"),
    "fused_loss": dict(),
    "fused_flex": dict(attention="flex"),
    "fused_flex_tflex": dict(attention="flex", target_attention="flex"),
    "fused_flex_tflex_compile": dict(attention="flex", target_attention="flex", compile_draft=True),
    "fused_flex_tflex_compile_tcompile": dict(
        attention="flex", target_attention="flex", compile_draft=True, compile_target=True
    ),
    "fused_flex_tflex_compile_tcompile_lcompile": dict(
        attention="flex",
        target_attention="flex",
        compile_draft=True,
        compile_target=True,
        compile_loss=True,
    ),
    "fsdp": dict(attention="flex", target_attention="flex", distributed="fsdp"),
}
STEP_PHASES = ("anchors", "target_forward", "draft_and_loss_forward", "backward", "optimizer")
INNER_PHASES = ("draft_forward", "loss_forward", "teacher_logits")


# ---------------------------------------------------------------------------- building blocks
def measured_bf16_flops(n: int = 8192, iters: int = 10) -> float:
    """The bf16 matmul rate of this GPU on random data: the MFU denominator."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - t0)


def build_target(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Random-weight HF causal LM of SHAPES[shape], built in seconds: meta device, `to_empty`,
    normal(0, 0.02) matrices, unit norm weights, the rotary tables recomputed on `device`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    spec = SHAPES[shape]
    cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config, "llama": LlamaConfig}[spec["family"]]
    hf = cls(**spec["target"], attn_implementation="sdpa")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # RMSNorm weights
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        for mod in model.modules():  # non-persistent buffers are garbage after to_empty
            if type(mod).__name__.endswith("RotaryEmbedding"):
                fresh = type(mod)(config=model.config)  # on the CPU; copied below
                for bname, buf in fresh.named_buffers(recurse=False):
                    getattr(mod, bname).copy_(buf.to(getattr(mod, bname).dtype))
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model.requires_grad_(False).eval()


def synthetic_rows(vocab: int, seq_len: int, rows: int, seed: int = 0):
    """Packed rows as `train.data.build_dataset` makes them: documents of 256-2048 tokens (cut
    at the row end), position ids restarting per document, loss mask 0 on each document's first
    token and its first ~30% ("prompt"), 1 on the rest."""
    import datasets

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab - 2, (rows, seq_len), generator=g)
    pos = torch.zeros(rows, seq_len, dtype=torch.long)
    doc = torch.zeros(rows, seq_len, dtype=torch.long)
    mask = torch.zeros(rows, seq_len, dtype=torch.bool)
    for r in range(rows):
        start, d = 0, 0
        while start < seq_len:
            n = min(int(torch.randint(256, 2049, (1,), generator=g)), seq_len - start)
            pos[r, start : start + n] = torch.arange(n)
            doc[r, start : start + n] = d
            mask[r, start + max(1, int(0.3 * n)) : start + n] = True
            start, d = start + n, d + 1
    return datasets.Dataset.from_dict(
        {
            "input_ids": ids.tolist(),
            "loss_mask": mask.tolist(),
            "position_ids": pos.tolist(),
            "doc_ids": doc.tolist(),
        }
    )


def synthetic_vocab_map(vocab: int, draft_vocab: int, seed: int = 0):
    """d2t/t2d from Zipf-like counts over a random permutation of the ids (common.vocab)."""
    from common.vocab import build_vocab_map

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(vocab, generator=g)
    counts = torch.zeros(vocab, dtype=torch.long)
    counts[order] = (1e7 / torch.arange(1, vocab + 1).double()).long()
    return build_vocab_map(counts, draft_vocab)


class PhaseTimer:
    """`train.loop.phases` recorder: CUDA events per phase (no sync inside the step), or
    synchronised perf_counter on CPU. `totals()` -> seconds per phase since the last reset."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.reset()

    def reset(self):
        self.events = defaultdict(list)
        self.cpu = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            yield
            e.record()
            self.events[name].append((s, e))
        else:
            t0 = time.perf_counter()
            yield
            self.cpu[name] += time.perf_counter() - t0

    def totals(self) -> dict[str, float]:
        if not self.cuda:
            return dict(self.cpu)
        torch.cuda.synchronize()
        return {k: sum(s.elapsed_time(e) for s, e in v) / 1e3 for k, v in self.events.items()}


def instrument(trainer, timer) -> None:
    """Time the trainer's step parts without touching its code: its collaborators are wrapped
    on this instance (anchors = `_prepare`, target forward = the capture, draft + loss forward =
    the objective's forward, backward = `accelerator.backward`, optimizer = clip + step +
    zero_grad). The draft/loss/teacher split inside comes from `train.loop.phases` marks.
    The trainer draws the next step's batches and anchors while the device runs a step, so
    `anchors` holds only the device work they add (copies, block targets); the host's sampling
    shows only where the device waits for it, as `other`."""

    def timed(name, fn):
        def call(*a, **k):
            with timer(name):
                return fn(*a, **k)

        return call

    class TimedCapture:
        def __init__(self, capture):
            self._capture = capture

        def __call__(self, *a, **k):
            with timer("target_forward"):
                return self._capture(*a, **k)

        def __getattr__(self, item):
            return getattr(self._capture, item)

    trainer._prepare = timed("anchors", trainer._prepare)
    trainer.capture = TimedCapture(trainer.capture)
    trainer.objective.forward = timed("draft_and_loss_forward", trainer.objective.forward)
    trainer.acc.backward = timed("backward", trainer.acc.backward)
    trainer.acc.clip_grad_norm_ = timed("optimizer", trainer.acc.clip_grad_norm_)
    trainer.opt.step = timed("optimizer", trainer.opt.step)
    trainer.opt.zero_grad = timed("optimizer", trainer.opt.zero_grad)


def linear_params(h, inter, nh, nkv, hd, layers) -> int:
    return layers * (h * hd * (2 * nh + 2 * nkv) + 3 * h * inter)


def teacher_rows(batch: dict, tg, share_teacher: bool) -> float:
    """The rows the loss computes the teacher's logits for: the distinct label-1 positions of the
    supervised draft rows (U), or every supervised row (M) without `share_teacher`."""
    from train.loop.vocab_loss import shared_teacher_counts

    rows, positions = shared_teacher_counts(tg, batch["input_ids"].shape[1])
    return float(positions if share_teacher else rows)


def step_flops(
    target_cfg, dcfg, batch: dict, anchors, valid, tg, teacher_rows_n: float | None = None
) -> dict[str, float]:
    """Model FLOPs of one micro-batch, by the formula of the module docstring; `teacher_rows_n`:
    the rows the teacher's logits are computed for (`teacher_rows`; None: every supervised row)."""
    t = target_cfg
    hd_t = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    p_t = linear_params(
        t.hidden_size,
        t.intermediate_size,
        t.num_attention_heads,
        t.num_key_value_heads,
        hd_t,
        t.num_hidden_layers,
    )
    tokens = batch["input_ids"].numel()
    doc = batch["doc_ids"]
    docs_sq = 0
    for row in doc:
        lens = torch.unique_consecutive(row, return_counts=True)[1].double()
        docs_sq += float((lens * (lens + 1) / 2).sum())
    att_t = 4 * t.num_hidden_layers * t.num_attention_heads * hd_t * docs_sq
    m = float(tg.mask.sum())
    u = m if teacher_rows_n is None else teacher_rows_n
    d = dcfg
    p_d = linear_params(
        d.hidden_size,
        d.intermediate_size,
        d.num_attention_heads,
        d.num_key_value_heads,
        d.head_dim,
        d.num_hidden_layers,
    )
    p_ctx = d.fc_input_size * d.hidden_size
    p_ctx += d.num_hidden_layers * 2 * d.num_key_value_heads * d.head_dim * d.hidden_size
    n, a = anchors.shape
    b = d.block_size
    start = batch["position_ids"].gather(1, anchors)  # tokens of the anchor's doc before it
    visible = float((b * (start + b)).sum())
    att_d = 3 * 4 * d.num_hidden_layers * d.num_attention_heads * d.head_dim * visible
    r = d.markov_rank
    out = {
        "target": 2 * p_t * tokens + att_t,
        "teacher": 2 * t.vocab_size * t.hidden_size * u,
        "draft": 6 * p_d * n * a * b + 6 * p_ctx * tokens + att_d,
        "head": 4 * d.draft_vocab * d.hidden_size * m + 6 * d.draft_vocab * r * m,
    }
    out["total"] = sum(out.values())
    return out


# ---------------------------------------------------------------------------- one variant
def parse_variant(spec: str) -> tuple[dict, list[str]]:
    """'fused_flex+trainer.micro_batch_size=64' -> (settings, ['trainer.micro_batch_size=64'])."""
    name, *extra = spec.split("+")
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r} in {spec!r}: choose from {list(VARIANTS)}")
    return {**VARIANT_DEFAULTS, **VARIANTS[name]}, extra


def compose(shape: str, device: str, extra: list[str], out_dir: str):
    from train.config_io import compose_config

    gpu = device == "cuda"
    over = [
        *SHAPES[shape]["overrides"],
        f"trainer={'gpu' if gpu else 'cpu'}",
        "logger=none",
        "data.train=synthetic",
        "data.heldout=null",
        "data.regenerate.enabled=false",
        "target.path=random-weights",
        "target.build_tiny=false",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        f"output_dir={out_dir}",
        *extra,
    ]
    return compose_config(over)


def run_variant(spec: str, shape: str, target, dev, args, user_over: list[str]) -> dict:
    from common.model import DSparkDraftModel
    from common.target import target_head_weights
    from train.data import collate
    from train.distill import make_accelerator
    from train.init.draft_config import draft_config
    from train.loop.objective import init_draft_weights
    from train.loop.phases import set_recorder
    from train.loop.target import apply_speed_settings
    from train.loop.trainer import Trainer

    v, extra = parse_variant(spec)
    with tempfile.TemporaryDirectory() as tmp, vocab_grad_mode(v["vocab_grad"]):
        over = [
            f"trainer.distributed={v['distributed']}",
            f"trainer.draft_attention={v['attention']}",
            f"trainer.target_attention={v['target_attention']}",
            f"trainer.compile_draft={str(v['compile_draft']).lower()}",
            f"trainer.compile_target={str(v['compile_target']).lower()}",
            f"trainer.compile_loss={str(v['compile_loss']).lower()}",
            *user_over,
            *extra,
        ]
        cfg = compose(shape, dev.type, over, tmp)
        tc = cfg.trainer
        rows = tc.micro_batch_size * tc.grad_accum * (args.warmup + args.steps)
        vocab = target.config.vocab_size
        ds = synthetic_rows(vocab, cfg.data.seq_len, rows, cfg.seed)
        acc = make_accelerator(tc)
        dcfg = draft_config(cfg.draft, target, None, "random-weights")
        torch.manual_seed(cfg.seed)  # as train.distill.run: every variant starts from one draft
        with torch.device(acc.device):
            draft = DSparkDraftModel(dcfg)
        init_draft_weights(draft)
        vmap = synthetic_vocab_map(vocab, dcfg.draft_vocab_size) if dcfg.reduced_vocab else None
        embed, head = target_head_weights(target)
        maps = (vmap.d2t.to(acc.device), vmap.t2d.to(acc.device)) if vmap else ()
        draft.init_from_target(embed.float(), head.float(), *maps)
        apply_speed_settings(cfg.trainer, draft, target, acc.device)
        trainer = Trainer(cfg, acc, target, draft, ds, None, Path(tmp), {}, {})
        cuda = acc.device.type == "cuda"
        timer = PhaseTimer(cuda)
        instrument(trainer, timer)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        try:
            first = None
            for _ in range(args.warmup):
                out = trainer.train_step()
                first = first or out
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            timer.reset()  # the warm-up steps were timed too
            set_recorder(timer)
            times, tokens = [], 0
            for _ in range(args.steps):
                t0 = time.perf_counter()
                out = trainer.train_step()
                sync()
                times.append(time.perf_counter() - t0)
                tokens += out["tokens"]
            phases = timer.totals()
        finally:
            set_recorder(None)
        prof = profile_step(trainer, spec, args.profile_dir, cuda) if args.profile_dir else None
        # FLOPs from the first micro-batch, with the anchors the trainer draws for it.
        cols = ["input_ids", "loss_mask", "position_ids", "doc_ids"]
        batch = collate(ds.with_format("numpy", columns=cols)[: tc.micro_batch_size])
        batch = {k: v.to(acc.device) for k, v in batch.items()}
        anchors, valid, tg = trainer._prepare(batch, 0)
        u = teacher_rows(batch, tg, cfg.loss.share_teacher)
        fl = step_flops(target.config, dcfg, batch, anchors, valid, tg, u)
        per_step = tc.grad_accum * acc.num_processes
        wall = sum(times)
        row = {
            "variant": spec,
            "shape": shape,
            "tokens_per_step": tokens // args.steps,
            "tokens_per_s": tokens / wall,
            "step_ms": 1e3 * wall / args.steps,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "tflop_per_step": fl["total"] * per_step / 1e12,
            "teacher_rows_per_supervised_row": u / max(float(tg.mask.sum()), 1.0),
        }
        row["model_tflops_per_s"] = row["tflop_per_step"] * args.steps / wall
        for k in (*STEP_PHASES, *INNER_PHASES):
            row[f"{k}_ms"] = 1e3 * phases.get(k, 0.0) / args.steps
        row["other_ms"] = row["step_ms"] - sum(row[f"{k}_ms"] for k in STEP_PHASES)
        tf = phases.get("target_forward", 0.0)
        row["target_forward_tokens_per_s"] = tokens / tf if tf else None
        row["flops_split_tflop"] = {k: v * per_step / 1e12 for k, v in fl.items()}
        row["loss"] = out["loss"]
        # Every variant starts from the same draft on the same batch: the first step's loss and
        # gradient norm must agree across rows (a numerics check of each variant on the device).
        row["first_step_loss"] = first["loss"] if first else None
        row["first_step_grad_norm"] = first["grad_norm"] if first else None
        if prof:
            row.update(prof)
        trainer.capture.close()
        target.set_attn_implementation("sdpa")
        del trainer, draft, acc
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        return row


def profile_step(trainer, spec: str, profile_dir: str, cuda: bool) -> dict:
    """One more step under torch.profiler: how busy the GPU is (kernel time / wall) and how many
    kernels the host launched; the op table goes to PROFILE_DIR/<variant>.txt. A low busy
    fraction with many launches means the step is bound by host-side (Python/launch) work."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        trainer.train_step()
        sync()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel"))
    kernel_us = 0.0
    if cuda:
        kernel_us = sum(
            getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
            for e in events
            if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)
        )
    Path(profile_dir).mkdir(parents=True, exist_ok=True)
    table = None
    for sort in ("self_device_time_total", "self_cuda_time_total") if cuda else ():
        try:
            table = events.table(sort_by=sort, row_limit=40)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    table = table or events.table(sort_by="self_cpu_time_total", row_limit=40)
    (Path(profile_dir) / f"{spec.replace('/', '_')}.txt").write_text(table)
    return {
        "profiled_step_ms": 1e3 * wall,
        "kernel_launches": launches if cuda else None,
        "gpu_busy_fraction": kernel_us / 1e6 / wall if cuda else None,
    }


def run_child(spec: str, args) -> dict:
    """A distributed variant in `torchrun --nproc-per-node 1` (accelerate then wraps the draft
    in FSDP/DDP as under `accelerate launch`); its row comes back as JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "row.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "1",
            str(Path(__file__).resolve().parent / "bench_train.py"),
            "--json",
            str(path),
            "step8b",
            "--shape",
            args.shape,
            "--device",
            args.device,
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--no-matmul",
            "--in-process",
            "--variants",
            spec,
            *(f"--set={o}" for o in args.overrides),
        ]
        # The repo first, then what the caller had (on the GPU image, the carried wheels' /tmp/site:
        # without it the child could not import `datasets`, seen 2026-12-03).
        path_entries = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path_entries))}
        rc = subprocess.run(cmd, env=env).returncode
        if rc != 0:
            return {"variant": spec, "shape": args.shape, "error": f"child exit code {rc}"}
        return json.loads(path.read_text())["rows"][0]


def bench_scale(args, on_row=None) -> dict:
    """-> {"rows": [...], "matmul_tflops_per_s": float | None, ...}; rows get MFU columns."""

    dev = torch.device(args.device)
    if dev.type == "cpu" and args.shape != "tiny":
        raise SystemExit(
            f"step8b --shape {args.shape} on the CPU would build a {args.shape} target in float32 "
            "here: run it on a GPU (--device cuda), or use --shape tiny for a plumbing check"
        )
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    variants = args.variants or SHAPES[args.shape]["variants"]
    if dev.type == "cpu":  # no CPU flex-attention backward; no single-process FSDP on CPU
        cpu_ok = dict(
            attention="sdpa",
            target_attention="sdpa",
            compile_draft=False,
            compile_target=False,
            compile_loss=False,
        )
        cpu_ok["distributed"] = "none"
        variants = [
            v for v in variants if all(parse_variant(v)[0][k] == x for k, x in cpu_ok.items())
        ]
    matmul = measured_bf16_flops() if dev.type == "cuda" and not args.no_matmul else None
    t0 = time.perf_counter()
    target = build_target(args.shape, dev, dtype)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    rows = []
    for spec in variants:
        distributed = parse_variant(spec)[0]["distributed"] != "none"
        if distributed and not args.in_process:
            rows.append(run_child(spec, args))
        else:
            try:
                rows.append(run_variant(spec, args.shape, target, dev, args, args.overrides))
            except Exception as e:  # one failing variant must not hide the others' numbers
                if not args.keep_going:
                    raise
                rows.append({"variant": spec, "shape": args.shape, "error": repr(e)[:300]})
        print(f"[step8b] {spec}: {json.dumps(rows[-1], default=str)[:400]}", flush=True)
        if on_row is not None:  # e.g. write the JSON so far: a time limit keeps finished rows
            on_row(result(args, rows, matmul, build_s, dev))
    return result(args, rows, matmul, build_s, dev)


def result(args, rows: list[dict], matmul: float | None, build_s: float, dev) -> dict:
    for r in rows:
        if "tokens_per_s" not in r or dev.type != "cuda":
            continue
        r["mfu_spec_peak"] = r["model_tflops_per_s"] * 1e12 / SPEC_PEAK_FLOPS
        if matmul:
            r["mfu_measured_matmul"] = r["model_tflops_per_s"] * 1e12 / matmul
    return {
        "shape": args.shape,
        "target_config": SHAPES[args.shape]["target"],
        "target_build_s": build_s,
        "matmul_tflops_per_s": matmul / 1e12 if matmul else None,
        "spec_peak_tflops_per_s": SPEC_PEAK_FLOPS / 1e12,
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "steps": args.steps,
        "warmup": args.warmup,
        "rows": rows,
    }


TABLE_KEYS = (
    "variant",
    "tokens_per_s",
    "step_ms",
    "peak_gib",
    "mfu_spec_peak",
    "mfu_measured_matmul",
    "target_forward_ms",
    "draft_forward_ms",
    "loss_forward_ms",
    "teacher_logits_ms",
    "backward_ms",
    "optimizer_ms",
    "anchors_ms",
    "other_ms",
    "gpu_busy_fraction",
    "kernel_launches",
    "first_step_loss",
    "first_step_grad_norm",
)


def print_scale_table(res: dict) -> None:
    mm = res["matmul_tflops_per_s"]
    print(
        f"shape {res['shape']} on {res['device']}; target built in {res['target_build_s']:.1f}s; "
        f"bf16 matmul 8192^3: {mm:.0f} TFLOP/s"
        if mm
        else f"shape {res['shape']}"
    )
    print("teacher_logits_ms is inside loss_forward (and backward for checkpoint_loss)")
    print(" | ".join(TABLE_KEYS))
    print(" | ".join("---" for _ in TABLE_KEYS))
    for r in res["rows"]:
        if "error" in r:
            print(f"{r['variant']} | error: {r['error']}")
            continue
        cells = []
        for k in TABLE_KEYS:
            v = r.get(k)
            cells.append(
                "-"
                if v is None
                else f"{v:.3f}"
                if isinstance(v, float) and v < 10
                else f"{v:.0f}"
                if isinstance(v, float)
                else str(v)
            )
        print(" | ".join(cells))


def add_parser(sub) -> None:
    sp = sub.add_parser("step8b", help="the real trainer step at a real target's shape")
    sp.add_argument("--shape", default="qwen3_8b", choices=sorted(SHAPES))
    sp.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    sp.add_argument("--steps", type=int, default=3)
    sp.add_argument("--warmup", type=int, default=2)
    sp.add_argument("--variants", nargs="*", help="default: the shape's list (VARIANTS)")
    sp.add_argument("--no-matmul", action="store_true", help="skip the matmul-rate measurement")
    sp.add_argument("--in-process", action="store_true", help="distributed variants here too")
    sp.add_argument("--keep-going", action="store_true", help="a failing variant gives a row")
    sp.add_argument("--profile-dir", help="profile one more step per variant; tables here")
    sp.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra train.distill override for every variant (repeatable)",
    )
