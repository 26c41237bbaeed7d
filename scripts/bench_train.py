"""Benchmark the distillation side; prints tables (a benchmark script, never a timed test).

    python scripts/bench_train.py loss                     # CPU: loss peak memory, chunked vs not
    python scripts/bench_train.py loss --device cuda --hidden 4096 --anchors 512   # H200
    python scripts/bench_train.py step                     # tiny run: tokens/s, peak memory
    python scripts/bench_train.py step --gpu               # same run on the GPU (trainer=gpu)
    python scripts/bench_train.py --json r.json step8b     # real trainer step, Qwen3-8B shape
    python scripts/bench_train.py step8b --shape smollm2_135m   # ... SmolLM2-135M shape

`step8b` (scripts/bench_train_scale.py): the trainer's step with a random-weight target of a
real model's shape built in memory; one row per speed variant, step split, MFU.

`loss`: fwd+bwd of `train.loop.loss.distill_loss` alone (the draft's hidden states are leaves) at
vocab
151,936, with `chunk_tokens` = --chunk and = all rows (unchunked, what a naive loss does), and
chunked with the teacher computed once per draft row instead of once per position the rows share
(`loss.share_teacher=false`): peak memory above baseline and time, and their ratios to the first
row, measured in one run.
    python scripts/bench_train.py loss --vocab 49152 --hidden 576 --draft-vocab 16384 \
      --rank 256 --block 7 --seq 2048 --anchors 512 --chunk 1024   # SmolLM2's loss shape
`step`: runs `python -m train.distill +experiment=tiny` in-process for a few steps and reports
median tokens/s (target forward + draft forward/backward + optimizer) from metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.config import DSparkConfig  # noqa: E402
from common.model import DSparkDraftModel  # noqa: E402
from common.vocab import build_vocab_map  # noqa: E402
from scripts import bench_train_scale  # noqa: E402
from scripts.bench_draft import CudaPeak, RssPeak, measure  # noqa: E402
from scripts.bench_train_scale import measured_bf16_flops  # noqa: E402
from train.loop.anchors import sample_anchors  # noqa: E402
from train.loop.loss import block_targets, distill_loss  # noqa: E402
from train.loop.vocab_loss import shared_teacher_counts  # noqa: E402


def bench_loss(a) -> list[dict]:
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    cfg = DSparkConfig(
        vocab_size=a.vocab,
        target_hidden_size=a.hidden,
        target_num_hidden_layers=8,
        target_layer_ids=[1, 3],
        mask_token_id=a.vocab - 1,
        hidden_size=a.hidden,
        num_hidden_layers=1,
        num_attention_heads=max(1, a.hidden // 128),
        num_key_value_heads=max(1, a.hidden // 512),
        head_dim=128,
        intermediate_size=2 * a.hidden,
        block_size=a.block,
        markov_rank=a.rank,
        draft_vocab_size=a.draft_vocab,
    )
    with torch.device(dev):
        model = DSparkDraftModel(cfg).to(dtype)
    if cfg.reduced_vocab:  # any draft vocab: the cost does not depend on which ids it holds
        maps = build_vocab_map(torch.randint(0, 1000, (a.vocab,)), a.draft_vocab)
        embed = torch.randn(a.vocab, a.hidden, device=dev)
        model.init_from_target(embed, embed, maps.d2t.to(dev), maps.t2d.to(dev))
    t = a.seq
    ids = torch.randint(0, a.vocab - 1, (1, t), device=dev)
    loss_mask = torch.ones(1, t, dtype=torch.bool, device=dev)
    anchors, valid = sample_anchors(loss_mask, a.anchors, 0, 0, ids)
    with torch.no_grad():
        fo = model.forward_train(
            torch.randn(1, t, 2 * a.hidden, device=dev, dtype=dtype), ids, anchors, valid
        )
    fo.hidden = fo.hidden.detach().requires_grad_()
    fo.markov_input = fo.markov_input.detach().requires_grad_()
    tg = block_targets(ids, loss_mask, anchors, valid, cfg.num_speculative_tokens, model.t2d)
    final = torch.randn(1, t, a.hidden, device=dev, dtype=dtype)
    head = torch.randn(a.vocab, a.hidden, device=dev, dtype=dtype) * 0.02
    rows, positions = shared_teacher_counts(tg, t)
    out = []
    variants = (
        (f"chunked ({a.chunk} rows)", a.chunk, True),
        ("chunked, teacher per row", a.chunk, False),
        ("unchunked", rows + 1, True),
    )
    for name, chunk, share in variants:

        def step(chunk=chunk, share=share):
            loss, _ = distill_loss(
                model,
                fo,
                tg,
                final,
                head,
                tg.dens(),
                chunk_tokens=chunk,
                vocab_grad=a.vocab_grad,
                share_teacher=share,
            )
            loss.backward()
            fo.hidden.grad = fo.markov_input.grad = None

        r = measure(step, model, a.device, a.warmup, a.iters)
        teacher_rows = positions if share else rows
        out.append(
            {
                "loss": name,
                "vocab_grad": a.vocab_grad,
                "rows": rows,
                "teacher_rows": teacher_rows,
                "vocab": a.vocab,
                "draft_vocab": a.draft_vocab or a.vocab,
                **r,
            }
        )
    return out


def bench_step(a) -> list[dict]:
    from train.distill import main

    with tempfile.TemporaryDirectory() as tmp:
        over = [
            f"+experiment={a.experiment}",
            f"output_dir={tmp}",
            f"trainer.max_steps={a.steps}",
            "trainer.eval_every=0",
            "trainer.save_every=0",
            "trainer.progress=false",
            "data.heldout=null",
            "export.speculators=false",
        ]
        if a.gpu and a.experiment == "tiny":  # GPU experiments choose their own trainer
            over += [
                "trainer=gpu",
                "trainer.micro_batch_size=16",
                "data.seq_len=1024",
                "trainer.num_anchors=256",
            ]
        dev = "cuda" if a.gpu else "cpu"
        with CudaPeak(dev) if a.gpu else RssPeak() as mem:
            rc = main(over + a.overrides)
        if rc != 0:
            raise SystemExit(rc)
        recs = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        prov = json.loads((Path(tmp) / "final" / "provenance.json").read_text())
    tps = [r["tokens_per_s"] for r in recs if r["split"] == "train"][1:]  # skip warm-up step
    row = {
        "run": a.experiment + (" (gpu)" if a.gpu else " (cpu)"),
        "steps": a.steps,
        "tokens_per_s_median": statistics.median(tps),
        "tokens_per_s_max": max(tps),
        "peak_mib": mem.delta / 2**20,
    }
    if a.gpu:
        flops_per_token = step_flops_per_token(prov["resolved_config"], prov["dspark_config"])
        peak = measured_bf16_flops()
        row["model_tflops_per_s"] = flops_per_token * row["tokens_per_s_median"] / 1e12
        row["bf16_matmul_tflops_per_s"] = peak / 1e12
        row["mfu"] = flops_per_token * row["tokens_per_s_median"] / peak
    return [row]


def step_flops_per_token(run: dict, draft: dict) -> float:
    """Approximate training FLOPs per sequence token: linear layers and heads only (attention
    scores excluded), 2*params per token forward, 3x that for forward+backward.
    - target forward: 2 * P_target(decoder, no embedding) per token;
    - teacher logits: 2 * V * H_t per supervised draft row;
    - draft: 6 * P_draft_backbone per block token (A*B per sequence), context K/V
      6 * 2 * kv * hd * H * L per token, fused head 6 * Vd * (H + r) per draft row (x4/3: the
      loss's checkpoint recompute).
    """
    from transformers import AutoConfig

    t = AutoConfig.from_pretrained(run["target"]["path"]).get_text_config()
    h, inter, nl = t.hidden_size, t.intermediate_size, t.num_hidden_layers
    hd = getattr(t, "head_dim", None) or h // t.num_attention_heads
    attn = h * hd * (2 * t.num_attention_heads + 2 * t.num_key_value_heads)
    p_target = nl * (attn + 3 * h * inter)
    dh, dl, di = draft["hidden_size"], draft["num_hidden_layers"], draft["intermediate_size"]
    dhd, dkv = draft["head_dim"], draft["num_key_value_heads"]
    p_draft = dl * (dh * dhd * (2 * draft["num_attention_heads"] + 2 * dkv) + 3 * dh * di)
    seq, anchors = run["data"]["seq_len"], run["trainer"]["num_anchors"]
    block, nd = draft["block_size"], draft["num_speculative_tokens"]
    rows_per_token = anchors * nd / seq
    vd, r = draft["draft_vocab_size"], draft["markov_rank"]
    per_token = 2 * p_target + 2 * t.vocab_size * h * rows_per_token
    per_token += 6 * p_draft * anchors * block / seq + 6 * dl * 2 * dkv * dhd * dh
    per_token += 6 * (4 / 3) * vd * (dh + r) * rows_per_token
    return float(per_token)


def print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    print(" | ".join("---" for _ in keys))
    for r in rows:
        print(" | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r.values()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="part", required=True)
    lp = sub.add_parser("loss")
    lp.add_argument("--device", default="cpu")
    lp.add_argument("--vocab", type=int, default=151_936)
    lp.add_argument("--draft-vocab", type=int, default=None, help="reduced draft vocab size")
    lp.add_argument("--hidden", type=int, default=256)
    lp.add_argument("--rank", type=int, default=64)
    lp.add_argument("--block", type=int, default=7)
    lp.add_argument("--anchors", type=int, default=256)
    lp.add_argument("--chunk", type=int, default=256, help="chunk_tokens of the chunked row")
    lp.add_argument("--seq", type=int, default=1024)
    lp.add_argument("--warmup", type=int, default=1)
    lp.add_argument("--iters", type=int, default=2)
    lp.add_argument("--vocab-grad", default="fused", choices=["fused", "checkpoint"])
    sp = sub.add_parser("step")
    sp.add_argument("--steps", type=int, default=12)
    sp.add_argument("--gpu", action="store_true")
    sp.add_argument("--experiment", default="tiny")
    sp.add_argument("overrides", nargs="*", help="extra train.distill overrides")
    bench_train_scale.add_parser(sub)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    if a.part == "step8b":
        save = (
            (lambda r: Path(a.json).write_text(json.dumps(r, indent=2, default=str)))
            if a.json
            else None
        )
        res = bench_train_scale.bench_scale(a, on_row=save)
        bench_train_scale.print_scale_table(res)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=2, default=str))
        return 0 if all("error" not in r for r in res["rows"]) else 1
    rows = bench_loss(a) if a.part == "loss" else bench_step(a)
    if a.part == "loss":
        for r in rows:
            r["peak_ratio_vs_chunked"] = r["peak_mib"] / max(rows[0]["peak_mib"], 1e-9)
            r["time_ratio_vs_chunked"] = r["mean_ms"] / rows[0]["mean_ms"]
    print_table(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
