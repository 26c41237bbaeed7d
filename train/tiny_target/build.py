"""`build_tiny_target`: corpus -> tokenizer -> chat data -> Qwen3 LM -> HF folder (reusable).

Steps, in order: select the corpus (corpus.py); train the byte-level BPE and wrap it with the
ChatML template (tokenizer.py); mine chat rows and write data/*.jsonl (chat_data.py); pack
rendered chats + raw text and train (train.py); score held-out chats and print a greedy sample
(evaluation.py); save into OUT.tmp-* and rename into place (artifact.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import GenerationConfig, Qwen3ForCausalLM

from train.errors import SetupError
from train.tiny_target import artifact
from train.tiny_target.chat_data import build_rows, write_jsonl
from train.tiny_target.corpus import Corpus, build_corpus
from train.tiny_target.evaluation import encode_rows, evaluate, greedy_sample, spread
from train.tiny_target.presets import Preset, get_preset
from train.tiny_target.tokenizer import ENDOFTEXT, IM_END, train_bpe, wrap_tokenizer
from train.tiny_target.train import BlockStream, pack, train

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "artifacts" / "tiny-target"


class DegenerateTarget(SetupError, ValueError):
    """The built (or reused) target's held-out loss is above its preset's bound: nothing trained
    against it would mean anything."""


def check_quality(summary: dict, where) -> None:
    """Raise DegenerateTarget when `summary`'s held-out loss is above the bound it was built to
    (time-budget builds of a preset with one; a step budget is taken as given)."""
    bound = summary.get("heldout_loss_bound")
    if bound is None:
        return
    loss = summary.get("heldout_loss")
    if loss is None or loss > bound:
        raise DegenerateTarget(
            f"tiny target {where}: held-out loss {loss} is above the bound {bound} after "
            f"{summary.get('steps')} steps ({summary.get('seconds')} s, stopped by "
            f"{summary.get('stopped_by')}): a degenerate target. Give it more time (target."
            "tiny_minutes=N, or --minutes N) and rebuild; a busy machine needs longer."
        )


@dataclass(frozen=True)
class TinyTargetBuild:
    """`path`: the HF model folder; `reused`: an existing build with the same recipe was kept;
    `summary`: the contents of `path/train_summary.json`."""

    path: Path
    reused: bool
    summary: dict


def log(msg: str) -> None:
    print(f"[tiny-target] {msg}", flush=True)


def use_bf16(dtype: str, device: torch.device) -> bool:
    """Resolve --dtype: "auto" is bf16 autocast on CUDA and on CPUs with native bf16 matmuls."""
    if dtype not in ("auto", "bf16", "fp32"):
        raise ValueError(f"dtype must be auto, bf16 or fp32, got {dtype!r}")
    if dtype != "auto":
        return dtype == "bf16"
    if device.type == "cuda":
        return True
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_tiny_target(
    out: str | Path = DEFAULT_OUT,
    preset: str = "tiny",
    minutes: float | None = None,
    steps: int | None = None,
    seed: int = 0,
    max_files: int | None = None,
    device: str = "cpu",
    *,
    vocab_size: int | None = None,
    dtype: str = "auto",
    compile_model: bool = False,
    threads: int | None = None,
    force: bool = False,
) -> TinyTargetBuild:
    """Build (or reuse) the tiny target LM folder at `out`; loadable offline with Auto* classes.

    Budget: `steps` optimizer steps (deterministic on one CPU), else `minutes` of training wall
    clock (default: the preset's); for a preset with a held-out loss target, training stops at
    that target and `minutes` is only the cap. A build or reused folder whose held-out loss is
    above the preset's bound raises DegenerateTarget. `max_files` caps code files and prose docs
    (None: preset default, 0: no cap). CPU builds use `threads` torch threads (default
    os.cpu_count()), restored afterwards. An existing `out` whose recipe.json hash matches is
    reused unless `force`. Raises ValueError for bad settings (DegenerateTarget is one).
    """
    p = get_preset(preset)
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if steps is None:
        minutes = p.default_minutes if minutes is None else minutes
        if minutes <= 0:
            raise ValueError(f"minutes must be > 0, got {minutes}")
    else:
        minutes = None  # a step budget wins: it is the reproducible one
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda requested but torch.cuda.is_available() is False")
    bf16 = use_bf16(dtype, dev)
    cap = p.max_files if max_files is None else (max_files or None)
    vocab = vocab_size or p.vocab_size
    out = Path(out)

    corpus = build_corpus(seed, cap)
    recipe = {
        "version": artifact.RECIPE_VERSION,
        "preset": {**p.as_dict(), "vocab_size": vocab},
        "steps": steps,
        "minutes": minutes,
        "seed": seed,
        "max_files": cap,
        "device_type": dev.type,
        "bf16": bf16,
        "compile": compile_model,
        "corpus_sha256": corpus.fingerprint(),
    }
    want = artifact.recipe_hash(recipe)
    if not force and artifact.reusable(out, want):
        log(f"reusing {out} (recipe {want[:12]} matches; pass --force to rebuild)")
        summary = json.loads((out / "train_summary.json").read_text())
        check_quality(summary, f"{out} (reused)")
        return TinyTargetBuild(out, True, summary)

    tmp = artifact.temp_dir_for(out)
    prev_threads = torch.get_num_threads()
    try:
        if dev.type == "cpu":
            torch.set_num_threads(threads or os.cpu_count() or 1)
        summary = _build_into(tmp, p, vocab, corpus, seed, steps, minutes, dev, bf16, compile_model)
        check_quality(summary, "build")
        record = {"recipe": recipe, "recipe_hash": want, "provenance": artifact.provenance(tmp)}
        (tmp / "recipe.json").write_text(json.dumps(record, indent=2) + "\n")
        published = artifact.publish(tmp, out, want)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        torch.set_num_threads(prev_threads)
    log(f"wrote {out}" if published else f"{out} was published concurrently; keeping that one")
    return TinyTargetBuild(out, not published, summary)


def _build_into(
    tmp: Path,
    p: Preset,
    vocab: int,
    corpus: Corpus,
    seed: int,
    steps: int | None,
    minutes: float | None,
    dev: torch.device,
    bf16: bool,
    compile_model: bool,
) -> dict:
    """Every build step, writing into `tmp`; returns the train summary."""
    t_start = time.monotonic()
    seed_everything(seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # only fp32 leftovers outside autocast

    tok = wrap_tokenizer(
        train_bpe((d.text for d in corpus.train), vocab), p.max_position_embeddings
    )
    pad_id, eos_id = tok.convert_tokens_to_ids(ENDOFTEXT), tok.convert_tokens_to_ids(IM_END)
    log(f"tokenizer: {len(tok)} tokens ({time.monotonic() - t_start:.1f}s)")

    train_rows, held_rows = build_rows(corpus.train, seed), build_rows(corpus.heldout, seed)
    write_jsonl(train_rows, tmp / "data" / "train.jsonl")
    write_jsonl(held_rows, tmp / "data" / "heldout.jsonl")

    def encode(texts: list[str]) -> list[list[int]]:
        # backend encode_batch: parallel, and no "longer than model_max_length" warnings
        encs = tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
        return [e.ids + [pad_id] for e in encs]  # <|endoftext|> separates packed documents

    chat_texts = tok.apply_chat_template([r["messages"] for r in train_rows], tokenize=False)
    chat_blocks = pack(encode(chat_texts), p.seq_len)  # [N_chat, T]
    raw_blocks = pack(encode([d.text for d in corpus.train]), p.seq_len)  # [N_raw, T]
    log(
        f"data: {len(train_rows)} train / {len(held_rows)} held-out rows, "
        f"{chat_blocks.numel() + raw_blocks.numel():,} packed tokens "
        f"({time.monotonic() - t_start:.1f}s)"
    )

    seed_everything(seed)  # weights independent of how much randomness data prep consumed
    model = Qwen3ForCausalLM(p.model_config(pad_id=pad_id, eos_id=eos_id)).to(dev)
    n_params = sum(t.numel() for t in model.parameters())
    budget = f"{steps} steps" if steps is not None else f"{minutes:g} min"
    if steps is None and p.heldout_loss_target is not None:
        budget = f"a held-out loss of {p.heldout_loss_target} (cap {minutes:g} min)"
    log(
        f"model: {n_params / 1e6:.2f}M params; training for {budget} on {dev} "
        f"(bf16={bf16}, threads={torch.get_num_threads()})"
    )
    stream = BlockStream(chat_blocks, raw_blocks, p.batch_size, seed, p.chat_fraction)
    eval_set = encode_rows(tok, spread(held_rows, p.eval_rows), p.seq_len)
    quality = None
    if steps is None and p.heldout_loss_target is not None:
        check_set = spread(eval_set, p.check_rows)
        quality = (
            lambda: evaluate(model, check_set, pad_id, dev, bf16)["heldout_loss"],
            p.heldout_loss_target,
        )
        log(f"held-out loss checked on {len(check_set)} chats every {p.check_every} steps")
    result = train(
        model,
        stream,
        p,
        steps=steps,
        minutes=minutes,
        device=dev,
        bf16=bf16,
        compile_model=compile_model,
        quality=quality,
    )
    log(
        f"trained {result.steps} steps, {result.tokens:,} tokens in {result.seconds:.0f}s "
        f"(stopped by {result.stopped_by}); loss {result.loss_first:.3f} -> {result.loss_last:.3f}"
    )

    metrics = evaluate(model, eval_set, pad_id, dev, bf16)
    uniform = math.log(len(tok))
    log(
        f"held-out loss {metrics['heldout_loss']:.3f} (assistant tokens "
        f"{metrics['heldout_assistant_loss']:.3f}); uniform = ln({len(tok)}) = {uniform:.3f}"
    )

    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=False
    )
    sample_row = next((r for r in held_rows if r["domain"] == "code"), held_rows[0])
    sample = greedy_sample(model, tok, sample_row, dev, max_new_tokens=64)
    log(f"sample ({sample['source']}) prompt tail:\n{sample['prompt'][-300:]}")
    log(f"greedy continuation:\n{sample['completion']}")

    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    summary = {
        "preset": p.name,
        "params": n_params,
        "steps": result.steps,
        "tokens": result.tokens,
        "seconds": round(result.seconds, 2),
        "total_seconds": round(time.monotonic() - t_start, 2),
        "loss_first": result.loss_first,
        "loss_last": result.loss_last,
        "stopped_by": result.stopped_by,
        "quality_checks": result.checks,
        "heldout_loss_bound": None if quality is None else p.heldout_loss_bound,
        **metrics,
        "uniform_loss": uniform,
        "device": str(dev),
        "bf16": bf16,
        "special_token_ids": {t: tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens},
        "corpus": {
            **corpus.stats(),
            "train_rows": len(train_rows),
            "heldout_rows": len(held_rows),
            "chat_tokens": chat_blocks.numel(),
            "raw_tokens": raw_blocks.numel(),
        },
        "sample": sample,
        "loss_curve": result.loss_curve,
    }
    (tmp / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
