"""Cut each assistant answer where it starts to loop: a copy of chat rows for training.

    python -m train.prepare.trim_repeats IN.jsonl OUT.jsonl --target DIR [--ngram 16]

A small target's answers loop: on SmolLM2-135M-Instruct, 68% of the tokens of its greedy answers
to ShareGPT prompts and 54% of its T=0.7 answers come after the first 16 tokens that repeat an
earlier run of 16. A draft learns to copy a loop
quickly, so those tokens fill training steps and held-out averages with easy positions, while
serving (256 new tokens) is decided earlier in the answer. Each answer is cut at the end of the
first repeated n-gram (one copy kept, so the draft still sees a loop begin); an answer without
one is kept whole. The cut is made in the text, at a token boundary of the target's tokenizer;
the row keeps its other fields. OUT.summary.json holds IN's summary (the regeneration's
provenance, if any) with the counts added under `trimmed_repeats`; OUT is written whole or not
at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from common.atomic_file import write_whole
from train.data.packaged import write_jsonl


def read_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from e
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
                raise ValueError(f"{path}:{n}: not a chat row (an object with a `messages` list)")
            rows.append(row)
    return rows


def first_repeat_end(ids: list[int], n: int) -> int | None:
    """End (exclusive) of the first n-gram of `ids` that repeats an earlier one (overlaps
    allowed), or None when no n-gram repeats."""
    seen: set[tuple[int, ...]] = set()
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i : i + n])
        if gram in seen:
            return i + n
        seen.add(gram)
    return None


def trim_answer(text: str, tokenizer, n: int) -> tuple[str, int, int]:
    """(text cut after its first repeated n-gram, tokens before, tokens after)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    end = first_repeat_end(ids, n)
    if end is None:
        return text, len(ids), len(ids)
    return text[: offsets[end - 1][1]], len(ids), end


def trim_rows(rows: list[dict], tokenizer, n: int) -> tuple[list[dict], dict]:
    out, stats = [], {"rows": len(rows), "answers": 0, "answers_cut": 0}
    before = after = 0
    for row in rows:
        msgs = []
        for m in row["messages"]:
            if m.get("role") == "assistant" and m.get("content"):
                text, nb, na = trim_answer(m["content"], tokenizer, n)
                stats["answers"] += 1
                stats["answers_cut"] += na < nb
                before, after = before + nb, after + na
                m = {**m, "content": text}
            msgs.append(m)
        out.append({**row, "messages": msgs})
    stats.update(
        ngram=n,
        answer_tokens_before=before,
        answer_tokens_after=after,
        share_of_answer_tokens_kept=after / before if before else 1.0,
    )
    return out, stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train.prepare.trim_repeats", description=__doc__.split("\n")[0]
    )
    p.add_argument("src", help="chat rows (jsonl, each with `messages`)")
    p.add_argument("dst", help="where the trimmed rows go")
    p.add_argument("--target", required=True, help="the target's folder (its tokenizer)")
    p.add_argument("--ngram", type=int, default=16, help="repeat length that marks a loop")
    a = p.parse_args(argv)
    if a.ngram < 2:
        p.error(f"--ngram must be >= 2, got {a.ngram}")
    src, dst = Path(a.src), Path(a.dst)
    if src.resolve() == dst.resolve():
        p.error("dst must differ from src")
    try:
        rows = read_rows(src)
    except (OSError, ValueError) as e:
        print(f"trim_repeats: {e}", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(a.target)
    out, stats = trim_rows(rows, tokenizer, a.ngram)
    summary_in = Path(f"{src}.summary.json")
    summary = json.loads(summary_in.read_text()) if summary_in.exists() else {}
    summary["trimmed_repeats"] = {"source": str(src), **stats}
    write_whole(f"{dst}.summary.json", json.dumps(summary, indent=2))
    write_jsonl(out, dst)
    print(
        f"trim_repeats: {stats['answers_cut']} of {stats['answers']} answers cut at their first "
        f"repeated {a.ngram}-gram; {stats['answer_tokens_after']:,} of "
        f"{stats['answer_tokens_before']:,} answer tokens kept "
        f"({stats['share_of_answer_tokens_kept']:.3f}) -> {dst}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
