"""Chat conversations mined from the corpus, written as OpenAI-format JSONL.

Row format (one JSON object per line):
    {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...],
     "domain": "code" | "prose", "source": "<doc name>"}

Design choices:
- Code rows: "Continue this Python code from <module>:\\n<k lines>" -> the next lines; some rows
  get a second turn ("Continue.") so multi-turn assistant masks are exercised downstream.
- Prose rows: "Continue the text:\\n<passage head>" -> its next words. Passages are docstrings and
  comment blocks of code docs, and paragraph windows of prose docs.
- Assistant content never starts with whitespace/newline: with the Qwen2 split pattern a leading
  newline would merge with the header's "\\n" and blur the assistant-mask boundary.
- One `random.Random(f"{seed}:{doc name}")` per document: a row depends only on its document,
  so capping the corpus never changes the rows of the documents that remain.
"""

from __future__ import annotations

import inspect
import json
import random
import re
from pathlib import Path

from train.tiny_target.corpus import Doc

CODE_CTX_CHARS, CODE_ANS_CHARS = 600, 400
PROSE_CTX_CHARS, PROSE_ANS_CHARS = 500, 300
MIN_PASSAGE_CHARS = 200
TRIPLE_QUOTED = re.compile(r"(\"\"\"|''')(.*?)\1", re.DOTALL)
SYSTEM_PROMPTS = {
    "code": "You are a concise assistant that continues Python code.",
    "prose": "You are a concise assistant that continues text.",
}


def module_name(doc: Doc) -> str:
    """'py:email/mime/text.py' -> 'email.mime.text' (package __init__ -> package)."""
    parts = doc.name.removeprefix("py:").removesuffix(".py").split("/")
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _take_lines(lines: list[str], limit: int, from_end: bool = False) -> list[str]:
    """Longest run of whole lines (from the start, or the end) whose text fits `limit` chars."""
    out, size = [], 0
    for line in reversed(lines) if from_end else lines:
        size += len(line) + 1
        if size > limit and out:
            break
        out.append(line[:limit])
    return out[::-1] if from_end else out


def _code_turn(lines: list[str], start: int, rng: random.Random) -> tuple[str, int] | None:
    """Answer text starting at `start` (leading blank lines skipped) and the index after it."""
    while start < len(lines) and not lines[start].strip():
        start += 1
    end = min(len(lines), start + rng.randint(2, 8))
    answer = "\n".join(_take_lines(lines[start:end], CODE_ANS_CHARS)).rstrip()
    if not answer.strip():
        return None
    return answer, start + answer.count("\n") + 1


def code_rows(doc: Doc, rng: random.Random) -> list[dict]:
    """Windows of a code file: k context lines -> next lines (sometimes a second turn)."""
    lines = [ln.rstrip() for ln in doc.text.splitlines()]
    n_rows = min(8, max(1, len(lines) // 50))
    rows = []
    for _ in range(n_rows):
        if len(lines) < 8:
            break
        k = rng.randint(4, 16)
        s = rng.randrange(0, max(1, len(lines) - k - 2))
        context = "\n".join(_take_lines(lines[s : s + k], CODE_CTX_CHARS, from_end=True))
        context = context.strip("\n")
        turn = _code_turn(lines, s + k, rng)
        if turn is None or not context.strip():
            continue
        messages = [
            {
                "role": "user",
                "content": f"Continue this Python code from {module_name(doc)}:\n{context}",
            },
            {"role": "assistant", "content": turn[0]},
        ]
        if rng.random() < 0.15 and (turn2 := _code_turn(lines, turn[1], rng)) is not None:
            messages += [
                {"role": "user", "content": "Continue."},
                {"role": "assistant", "content": turn2[0]},
            ]
        rows.append(_finish(messages, "code", doc, rng))
    return rows


def passages(doc: Doc) -> list[str]:
    """Prose passages: docstrings + comment blocks of code, paragraph windows of prose docs."""
    if doc.kind == "code":
        # Triple-quoted strings rather than ast docstrings: 20x faster, and the few non-docstring
        # hits (usage texts, templates) are prose too.
        out = [inspect.cleandoc(m.group(2)) for m in TRIPLE_QUOTED.finditer(doc.text)]
        block: list[str] = []
        for line in doc.text.splitlines() + [""]:
            if line.strip().startswith("#"):
                block.append(line.strip().lstrip("#").strip())
            elif block:
                out.append(" ".join(block))
                block = []
        return [p.strip() for p in out if len(p.strip()) >= MIN_PASSAGE_CHARS]
    paras = [p.strip() for p in doc.text.split("\n\n") if p.strip()]
    out, cur = [], ""
    for p in paras:  # greedy windows of whole paragraphs, ~one context + answer long
        cur = f"{cur}\n\n{p}" if cur else p
        if len(cur) >= PROSE_CTX_CHARS + PROSE_ANS_CHARS:
            out.append(cur)
            cur = ""
    if len(cur) >= MIN_PASSAGE_CHARS:
        out.append(cur)
    return out


def _cut_at_space(text: str, pos: int) -> int:
    """First whitespace index at or after `pos` (len(text) if none)."""
    while pos < len(text) and not text[pos].isspace():
        pos += 1
    return pos


def prose_rows(doc: Doc, rng: random.Random) -> list[dict]:
    """Up to 3 (code docs) / 6 (prose docs) "Continue the text" rows from the doc's passages."""
    ps = passages(doc)
    rng.shuffle(ps)
    rows = []
    for p in ps[: 3 if doc.kind == "code" else 6]:
        if len(p) > PROSE_CTX_CHARS + PROSE_ANS_CHARS:  # trim to the last whole word that fits
            p = p[: max(p.rfind(c, 0, PROSE_CTX_CHARS + PROSE_ANS_CHARS) for c in " \n")]
        cut = _cut_at_space(p, int(len(p) * rng.uniform(0.4, 0.7)))
        head, tail = p[:cut].rstrip(), p[cut:].lstrip()
        tail = tail[: _cut_at_space(tail, PROSE_ANS_CHARS)] if len(tail) > PROSE_ANS_CHARS else tail
        if len(tail.strip()) < 20:
            continue
        messages = [
            {"role": "user", "content": f"Continue the text:\n{head}"},
            {"role": "assistant", "content": tail.rstrip()},
        ]
        rows.append(_finish(messages, "prose", doc, rng))
    return rows


def _finish(messages: list[dict], domain: str, doc: Doc, rng: random.Random) -> dict:
    """Prepend a system prompt to ~20% of rows; attach domain and source."""
    if rng.random() < 0.2:
        messages = [{"role": "system", "content": SYSTEM_PROMPTS[domain]}, *messages]
    return {"messages": messages, "domain": domain, "source": doc.name}


def build_rows(docs: list[Doc], seed: int) -> list[dict]:
    """All rows for `docs` (code rows then prose rows per doc), in doc order."""
    rows = []
    for doc in docs:
        rng = random.Random(f"{seed}:{doc.name}")
        if doc.kind == "code":
            rows += code_rows(doc, rng)
        rows += prose_rows(doc, rng)
    return rows


def write_jsonl(rows: list[dict], path: Path) -> None:
    """One JSON object per line, UTF-8, keys in insertion order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """Inverse of `write_jsonl`."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
