"""Benchmark the embedded engine: target-only vs DSpark decoding, on held-out prompts.

    python scripts/bench_engine.py [--target DIR --checkpoint DIR] [--prompts FILE] [--batch 1 4]

Defaults: the quickstart's pair, `artifacts/tiny-target` + `outputs/tiny/final`, prompted with
the target's held-out chat rows (TARGET/data/heldout.jsonl: what `data.heldout=auto` held out
of the draft's training, so the draft never saw them); `--prompts FILE` names other held-out
rows. A speed-up only means something for a trained draft on text like its training data's
but not in it. Random token prompts (`--random-prompts`) are neither: the target either drifts
where the draft has nothing to predict (acceptance length ~1) or falls into repeating itself,
which any draft predicts (the tiny pair: acceptance length 8.00 of 8, an inflated 2.95x); a
random draft measures overhead only. Without a trained pair the script stops (exit 2) and says
how to make one, unless `--synthetic` asks for a synthetic pair explicitly (random: overhead
only; tuned: a context-free target with a draft tuned to it, an upper bound), prompted with
random tokens.
Prints tokens/s per (mode, batch), the realized mean acceptance length, the draft step's time
split (backbone vs Markov loop) and batched vs per-request verification cost.
`--num-spec 1 3 7 --adaptive both` compares drafts per round and adaptive verification
(a real draft; each variant against the same target-only row).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serve.engine import Engine, EngineOptions, SamplingParams  # noqa: E402


def load_real(args):
    """The target-only engine and a builder of speculative engines, one per (N, adaptive)."""
    opts = dict(
        target=args.target,
        dtype=args.dtype,
        draft_sampling=args.draft_sampling,
        device=args.device,
        max_num_seqs=max(args.batch),
    )
    base = Engine.from_options(EngineOptions(**opts))

    def spec(num_spec: int | None, adaptive: bool) -> Engine:
        return Engine.from_options(
            EngineOptions(
                **opts,
                checkpoint=args.checkpoint,
                num_speculative_tokens=num_spec,
                adaptive_verification=adaptive,
            )
        )

    return base, spec


def random_pair(block_size: int):
    """A random Qwen3 target (8 layers, hidden 256, vocab 4096) and a random 1-layer draft."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from common.config import DSparkConfig
    from common.model import DSparkDraftModel

    torch.manual_seed(0)
    tc = Qwen3Config(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        tie_word_embeddings=False,
    )
    target = Qwen3ForCausalLM(tc).eval()
    cfg = DSparkConfig.from_target(
        tc, mask_token_id=4095, num_hidden_layers=1, block_size=block_size, markov_rank=64
    )
    draft = DSparkDraftModel(cfg)
    draft.init_from_target(target.get_input_embeddings().weight, target.lm_head.weight)
    return target, draft.eval()


def load_synthetic(args):
    if args.synthetic == "tuned":
        from tests.unit.test_engine_helpers import make_draft, make_target

        target = make_target(0, predictable=True, sharpness=30.0).float()
        draft = make_draft(target, True, None, tuned=True, block_size=args.block_size).float()
    else:
        target, draft = random_pair(args.block_size)

    def engine(d):
        opts = EngineOptions(
            target="<synthetic>",
            checkpoint=None if d is None else "<synthetic>",
            draft_sampling=args.draft_sampling,
            max_num_seqs=max(args.batch),
        )
        return Engine(target, d, opts, eos_token_ids=[])

    return engine(None), lambda num_spec, adaptive: engine(draft)


def prompts(engine: Engine, batch: int, args, rep: int) -> list[list[int]]:
    """Batch `rep` of the held-out prompts (cycled), else (asked for) random token prompts."""
    if args.real_prompts:
        pool = args.real_prompts
        return [pool[(rep * batch + i) % len(pool)] for i in range(batch)]
    g = torch.Generator().manual_seed(rep)
    vocab = engine.target.lm_head.weight.shape[0]
    return [torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(batch)]


def run(engine: Engine, batch: int, args) -> dict:
    # Random prompts run to max_tokens; real ones stop where the target stops (the same tokens in
    # both modes at T=0, so both decode the same text).
    params = [
        SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=i,
            ignore_eos=not args.real_prompts,
        )
        for i in range(batch)
    ]
    engine.generate(prompts(engine, batch, args, 99), params)  # warm-up
    s0 = engine.stats.snapshot()
    t0 = time.perf_counter()
    for rep in range(args.repeats):
        engine.generate(prompts(engine, batch, args, rep), params)
    wall = time.perf_counter() - t0
    s1 = engine.stats.snapshot()
    drafts = s1.spec.num_drafts - s0.spec.num_drafts
    acc = s1.spec.num_accepted_tokens - s0.spec.num_accepted_tokens
    return {
        "tok_s": (s1.generation_tokens - s0.generation_tokens) / wall,
        "mal": 1 + acc / drafts if drafts else float("nan"),
        "backbone_ms": 1e3 * (s1.time_backbone - s0.time_backbone) / max(drafts / batch, 1),
        "markov_ms": 1e3 * (s1.time_markov - s0.time_markov) / max(drafts / batch, 1),
        "verify_ms": 1e3 * (s1.time_verify - s0.time_verify) / max(s1.steps - s0.steps, 1),
    }


def verify_batching(engine: Engine, batch: int, iters: int = 20) -> tuple[float, float]:
    """ms for one [batch, N+1] verify forward vs `batch` separate [1, N+1] forwards."""
    q = engine.num_spec + 1
    ids = torch.randint(3, 50, (batch, q))
    start = torch.full((batch,), 64, dtype=torch.long)
    rows = list(range(batch))
    engine.target.forward(rows, ids, start)

    def timed(fn):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return 1e3 * (time.perf_counter() - t0) / iters

    batched = timed(lambda: engine.target.forward(rows, ids, start))
    single = timed(
        lambda: [engine.target.forward([r], ids[r : r + 1], start[r : r + 1]) for r in rows]
    )
    return batched, single


def usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--target", default=str(REPO / "artifacts/tiny-target"))
    ap.add_argument("--checkpoint", default=str(REPO / "outputs/tiny/final"))
    ap.add_argument(
        "--synthetic",
        choices=["random", "tuned"],
        help="no trained pair: a synthetic one (random: overhead only; tuned: an upper bound)",
    )
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32, help="random prompts' length")
    ap.add_argument(
        "--prompts",
        help="held-out chat rows (.jsonl[.gz]) to prompt with (default: "
        "TARGET/data/heldout.jsonl, the rows the draft's training held out)",
    )
    ap.add_argument(
        "--random-prompts",
        action="store_true",
        help="random token prompts instead (the draft has nothing to predict: overhead only)",
    )
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--draft-sampling", default="probabilistic")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--block-size", type=int, default=7, help="synthetic draft block size")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", default="cpu", help="engine device for a real target/draft")
    ap.add_argument(
        "--num-spec",
        type=int,
        nargs="+",
        help="speculative tokens per round to compare (default: the checkpoint's); real drafts",
    )
    ap.add_argument(
        "--adaptive",
        choices=["off", "on", "both"],
        default="off",
        help="adaptive verification (the confidence head picks each verify length); real drafts",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    real = Path(args.target).is_dir() and (Path(args.checkpoint) / "config.json").is_file()
    real = real and args.synthetic is None
    if real:
        prompt_file = args.prompts or str(Path(args.target) / "data" / "heldout.jsonl")
        if not args.random_prompts and not Path(prompt_file).is_file():
            return usage_error(
                f"no held-out prompts: {prompt_file} does not exist. Pass --prompts FILE (chat "
                "rows the draft did not train on), or --random-prompts to time overhead only."
            )
        source = f"target {args.target}, draft {args.checkpoint}"
        base, make_spec = load_real(args)
    elif args.synthetic is None:
        return usage_error(
            f"no trained pair at --target {args.target} / --checkpoint {args.checkpoint}: make "
            "the tiny one with `bash scripts/quickstart.sh` (or `python3 -m train.distill "
            "+experiment=tiny`), name yours with --target/--checkpoint, or pass --synthetic "
            "random|tuned for a synthetic pair (not a speed-up measurement)."
        )
    else:
        source = f"a {args.synthetic} synthetic tiny model (" + (
            "random 8-layer target + random draft: acceptance ~1, DSpark overhead only"
            if args.synthetic == "random"
            else "context-free target + draft tuned to it: an upper bound"
        )
        source += "), random token prompts"
        base, make_spec = load_synthetic(args)
    adaptive = {"off": [False], "on": [True], "both": [False, True]}[args.adaptive]
    # A synthetic draft has one variant: its own block, verified in full.
    variants = (
        [(n, a) for n in (args.num_spec or [None]) for a in adaptive] if real else [(None, False)]
    )
    engines = [make_spec(n, a) for n, a in variants]
    spec = engines[0]
    args.real_prompts = None
    if real and args.random_prompts:
        source += f"; random token prompts of {args.prompt_len} (the draft has nothing to predict)"
    elif real:
        from scripts.eval_acceptance import heldout_prompts

        found = heldout_prompts(
            args.target, spec.tokenizer, 10**6, {"p": prompt_file}, args.max_prompt_tokens
        )
        args.real_prompts = found.get("p") or []
        if not args.real_prompts:
            return usage_error(
                f"{prompt_file}: no prompt of at most --max-prompt-tokens={args.max_prompt_tokens}"
            )
        source += f"; {len(args.real_prompts)} held-out prompts from {prompt_file}"
    print(f"# {source}")
    print(
        f"# device {args.device if real else 'cpu'}, threads {args.threads}, "
        f"N={spec.num_spec}, T={args.temperature}, "
        f"draft_sampling={args.draft_sampling}, "
        + ("held-out prompts, " if args.real_prompts else f"prompt {args.prompt_len}, ")
        + f"max_tokens {args.max_tokens}, repeats {args.repeats}"
    )
    head = (
        f"{'mode':<12}{'batch':>6}{'tok/s':>10}{'speedup':>9}{'accept len':>12}"
        f"{'backbone ms':>13}{'markov ms':>11}{'markov %':>10}{'verify ms':>11}"
    )
    print(head)
    print("-" * len(head))
    rows = []
    for b in args.batch:
        r0 = run(base, b, args)
        print(f"{'target-only':<12}{b:>6}{r0['tok_s']:>10.1f}{1.0:>9.2f}{'-':>12}"
              f"{'-':>13}{'-':>11}{'-':>10}{r0['verify_ms']:>11.2f}")  # fmt: skip
        found = []
        for eng in engines:
            r1 = run(eng, b, args)
            r1.update(
                num_spec=eng.num_spec, adaptive=eng.adaptive, speedup=r1["tok_s"] / r0["tok_s"]
            )
            found.append(r1)
            label = f"dspark N={eng.num_spec}" + (" ad" if eng.adaptive else "")
            share = 100 * r1["markov_ms"] / max(r1["backbone_ms"] + r1["markov_ms"], 1e-9)
            print(f"{label:<14}{b:>4}{r1['tok_s']:>10.1f}{r1['speedup']:>9.2f}"
                  f"{r1['mal']:>12.2f}{r1['backbone_ms']:>13.2f}{r1['markov_ms']:>11.2f}"
                  f"{share:>9.1f}%{r1['verify_ms']:>11.2f}")  # fmt: skip
        # "dspark"/"speedup" = the first variant (the checkpoint's N unless --num-spec says).
        rows.append(
            {"batch": b, "target_only": r0, "dspark": found[0], "speedup": found[0]["speedup"],
             "variants": found}
        )  # fmt: skip
    print("\n# draft step time per round (all rows at once): backbone = parallel stage + base")
    print("# logits, markov = sequential loop (bias + sampling); verify ms = per engine step;")
    print("# 'ad' = adaptive verification (verify lengths from the confidence head).")
    for b in args.batch:
        if b > 1:
            batched, single = verify_batching(spec, b)
            print(
                f"# verify forward at batch {b}: batched {batched:.2f} ms vs per-request "
                f"{single:.2f} ms ({single / batched:.2f}x)"
            )
    if args.json:
        import json

        meta = {k: v for k, v in vars(args).items() if k != "real_prompts"}
        Path(args.json).write_text(json.dumps({"args": meta, "source": source, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
