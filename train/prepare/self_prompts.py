"""`python -m train.prepare.self_prompts --target DIR --out FILE --count N`: prompts the target
writes.

A chat model given its chat template up to where a user's words begin writes a user turn: sampled
(T=1 by default), these are requests of the kind it was tuned to answer, as many as wanted and none
read before (the Magpie recipe, Xu et al. 2024). Answered by the target (train.prepare.regenerate),
they are on-policy rows for a target that has no prompt set at hand, or whose prompt set a draft
reads too often: on SmolLM2 the Markov head's lead over DFlash is larger on rows it has read than on
new ones.

A turn is kept only if it ended (the model closed its turn before --max-new-tokens), has between
--min-chars and --max-chars characters, holds no chat-template marker, and is no repeat (compared
case- and space-folded); every drop is counted by reason in FILE's report (FILE.report.json), good
turns past --count as surplus. Rows:
{"id": "self/K", "messages": [{"role": "user", "content": ...}]}, written whole at the end (a
temporary file renamed), so a killed run leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from common.atomic_file import write_whole
from train.data.packaged import write_jsonl
from train.data.regenerate import BACKENDS, checked_sampling, open_generator, pick_backend

MARK = "\x00user turn\x00"  # stands in for the user's words when the template is rendered
REASONS = ("unfinished", "short", "long", "template", "repeat", "surplus")


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids the chat template puts before a lone user turn's content (a default system turn
    it adds stays in): the ids two such prompts share, so they are what a real prompt starts
    with, however the tokenizer splits text. ValueError if the template does not render a user
    turn's content exactly once, or puts nothing before it."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False)
    if text.count(MARK) != 1:
        raise ValueError("the chat template does not render a user turn's content exactly once")
    a, b = (
        tokenizer.apply_chat_template(
            [{"role": "user", "content": c}], tokenize=True, return_dict=True
        )["input_ids"]
        for c in ("Hello", "Goodbye")
    )
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if n == 0:
        raise ValueError("the chat template puts nothing before a user turn's content")
    return list(a[:n])


def template_markers(tokenizer) -> list[str]:
    """The special tokens' strings (e.g. <|im_start|>): a turn that writes one is not a prompt."""
    return [t for t in tokenizer.all_special_tokens if t]


def verdict(text: str, finish: str, seen: set[str], markers, min_chars: int, max_chars: int):
    """None if `text` is kept (its folded form then joins `seen`), else the reason it is dropped."""
    text = text.strip()
    if finish != "stop":
        return "unfinished"
    if len(text) < min_chars:
        return "short"
    if len(text) > max_chars:
        return "long"
    if any(m in text for m in markers):
        return "template"
    folded = " ".join(text.casefold().split())
    if folded in seen:
        return "repeat"
    seen.add(folded)
    return None


def write_prompts(
    generate: Callable,
    prefix: list[int],
    count: int,
    batch_size: int,
    max_batches: int,
    markers=(),
    min_chars: int = 10,
    max_chars: int = 2000,
    progress: bool = True,
) -> tuple[list[dict], dict]:
    """Up to `count` prompt rows from `generate` (a train.data.regen_backends generator: `(prompts,
    row_indices, chunk_index) -> [(text, finish)]`), `batch_size` samples of `prefix` a call, for
    at most `max_batches` calls. -> (rows, report: sampled, kept, dropped by reason; sampled is
    kept plus every drop)."""
    rows, seen, dropped = [], set(), Counter({r: 0 for r in REASONS})
    sampled = 0
    bar = tqdm(total=count, unit="prompt", desc="self prompts", disable=not progress)
    for chunk in range(max_batches):
        if len(rows) >= count:
            break
        first = chunk * batch_size
        out = generate([prefix] * batch_size, list(range(first, first + batch_size)), chunk)
        sampled += len(out)
        for text, finish in out:
            why = verdict(text, finish, seen, markers, min_chars, max_chars)
            if why is None and len(rows) >= count:
                why = "surplus"  # kept, but the last batch brought more than was asked
            if why is not None:
                dropped[why] += 1
            else:
                rows.append(
                    {
                        "id": f"self/{len(rows)}",
                        "messages": [{"role": "user", "content": text.strip()}],
                    }
                )
                bar.update(1)
    bar.close()
    report = {"asked": count, "sampled": sampled, "kept": len(rows), "dropped": dict(dropped)}
    return rows, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="HF folder of the target (its tokenizer too)")
    ap.add_argument("--out", required=True, help="the prompt rows (.jsonl)")
    ap.add_argument("--count", type=int, required=True, help="prompts wanted")
    ap.add_argument("--backend", choices=BACKENDS, default="auto")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=128, help="a longer turn is dropped")
    ap.add_argument("--batch-size", type=int, default=256, help="samples per generate call")
    ap.add_argument(
        "--max-batches", type=int, default=None, help="give up after this many (default: 4x count)"
    )
    ap.add_argument("--min-chars", type=int, default=10)
    ap.add_argument("--max-chars", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-cuda-graphs", action="store_true", help="vllm backend: CUDA graphs")
    a = ap.parse_args(argv)
    for name in ("count", "batch_size", "max_batches", "min_chars", "max_chars"):
        value = getattr(a, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if a.min_chars > a.max_chars:
        ap.error(f"--min-chars {a.min_chars} is over --max-chars {a.max_chars}")
    if a.temperature <= 0:
        ap.error("--temperature must be > 0: greedy writes one prompt, over and over")
    max_batches = a.max_batches or -(-4 * a.count // a.batch_size)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.target)
    prefix = user_turn_prefix(tokenizer)
    sampling = checked_sampling(
        {
            "temperature": a.temperature,
            "top_p": a.top_p,
            "max_new_tokens": a.max_new_tokens,
            "seed": a.seed,
        }
    )
    backend = pick_backend(a.backend, a.target)
    start = time.perf_counter()
    generate = open_generator(
        backend, a.target, tokenizer, sampling, {"cuda_graphs": a.vllm_cuda_graphs}
    )
    try:
        rows, report = write_prompts(
            generate,
            prefix,
            a.count,
            a.batch_size,
            max_batches,
            template_markers(tokenizer),
            a.min_chars,
            a.max_chars,
        )
    finally:
        generate.close()
    report.update(
        target=os.fspath(a.target),
        backend=backend,
        sampling=sampling,
        seconds=round(time.perf_counter() - start, 1),
    )
    write_jsonl(rows, out)
    write_whole(f"{out}.report.json", json.dumps(report, indent=1) + "\n")
    print(
        f"[self_prompts] {report['kept']} of {report['asked']} prompts from {report['sampled']} "
        f"samples in {report['seconds']} s; dropped {report['dropped']} -> {out}"
    )
    if report["kept"] < a.count:
        print(f"[self_prompts] short of {a.count}: raise --max-batches", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
