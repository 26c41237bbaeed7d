"""Check that every number quoted in docs/benchmarks.md appears in the raw file it cites.

    python scripts/check_benchmark_numbers.py [DOC]      # exit 1 and one line per problem

Citation syntax (in the doc, visible to readers):
- `(raw: PATH[, PATH ...])` cites files (paths from the repo root) for the paragraph, list or
  table it sits in and every block after it, up to the next heading or the next block with a tag
  (blocks are separated by blank lines; a tag may wrap; inside a `code span` it is only an
  example).
- `(raw: ...; derived: 1.086 0.97)` also lists numbers computed from the cited ones (ratios,
  shares, sums) that the files do not print.
- `(raw: none, WHY)` says the numbers that follow have no committed raw file, and why; they
  are listed by `--unsourced` but not checked.
- `(paper: TEXT)` and `(issue: TEXT)` quote another source (the DSpark paper, the issue's text):
  the numbers inside those parentheses, and only those, are references, not our measurements;
  they are listed by `--references`, not checked, and cite nothing for the rest of the block.
A block with numbers before any tag in its section is a problem ("no raw file cited").

Which numbers: those with a decimal point, and integers written with thousands commas
(1,672), outside `code spans` and fenced code, not part of a name (H200, Qwen3-8B, bf16), a
version (0.26.0) or a date/time. Plain small integers (settings, counts) are not checked.

Matching: a number with d decimals matches a raw value r when |x - r * s| <= half a unit in its
last place, for a scale s in 1, 100 (a percentage), 1000 or 1/1000 (s <-> ms), 2^-10, 2^-20
and 2^-30 (MiB -> GiB, bytes -> MiB, GiB), 1e-6 (a count in millions). Cite the smallest file
that holds the numbers: a large file of numbers would match almost anything.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
TAG = re.compile(r"\(raw:\s*([^)]*)\)")
REFERENCE = re.compile(r"\((?:paper|issue):[^)]*\)")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
# A number not glued to a name or another number: 1.086, 1,672, 2.25x, 9.6%, 0.29-0.39, 6.8/0.83.
NUMBER = re.compile(
    r"(?<![\w.,:])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e(-?\d+))?(?![\w]*\d|\.\d|:\d)"
)
# A minus sign (not a range dash) is a '-' after a space, '(' or the line start.
NEGATIVE = re.compile(r"(?:^|[\s(])-$")
VERSION_OF = re.compile(r"(?:vLLM|vllm|torch|transformers|driver|Python|CUDA|version)\s*$")
RAW_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
SCALES = (1.0, 100.0, 1000.0, 1e-3, 1e-6, 2.0**-10, 2.0**-20, 2.0**-30)


@dataclass
class Citation:
    files: list[str] = field(default_factory=list)
    derived: set[str] = field(default_factory=set)
    unsourced: str | None = None  # the reason given with `raw: none`


@dataclass
class Quote:
    line: int
    text: str  # as written
    value: float
    tolerance: float  # half a unit in the last place written


def parse_tag(body: str) -> Citation:
    body = " ".join(body.split())  # a tag may wrap over lines
    files_part, _, derived_part = body.partition("; derived:")
    derived = {d.rstrip(",") for d in derived_part.split() if d.rstrip(",")[:1].isdigit()}
    files_part = files_part.strip()
    if files_part.startswith("none"):
        return Citation([], derived, files_part.removeprefix("none").strip(" ,") or "no reason")
    return Citation([f.strip() for f in files_part.split(",") if f.strip()], derived)


def _blank(m: re.Match) -> str:
    """A removed span keeps its newlines, so line numbers stay right."""
    return re.sub(r"[^\n]", " ", m.group(0))


def strip_block(text: str) -> str:
    """The block without code spans (tags inside them are examples, not tags)."""
    return CODE_SPAN.sub(_blank, text)


def quotes_in(line: str, lineno: int) -> list[Quote]:
    text = LINK_TARGET.sub("]", line)
    out = []
    for m in NUMBER.finditer(text):
        whole, frac = m.group(1), m.group(2)
        if frac is None and "," not in whole and m.group(3) is None:
            continue  # a plain integer: a setting or a count, not checked
        before = text[: m.start()]
        if VERSION_OF.search(before):
            continue
        raw = ("-" if NEGATIVE.search(before) else "") + m.group(0)
        exponent = int(m.group(3) or 0)
        tol = 0.5 * 10.0 ** (exponent - (len(frac) - 1 if frac else 0))
        out.append(Quote(lineno, raw, float(raw.replace(",", "")), tol))
    return out


def blocks(lines: list[str]):
    """(kind, [(lineno, line)]) for headings and blank-line separated blocks, fences skipped."""
    block, fenced = [], False
    for i, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("#"):
            if block:
                yield "block", block
                block = []
            yield "heading", [(i, line)]
        elif not line.strip():
            if block:
                yield "block", block
                block = []
        else:
            block.append((i, line))
    if block:
        yield "block", block


def raw_values(path: Path, cache: dict[Path, list[float]]) -> list[float]:
    if path not in cache:
        cache[path] = [float(x) for x in RAW_NUMBER.findall(path.read_text(errors="replace"))]
    return cache[path]


def matches(q: Quote, values: list[float]) -> bool:
    tol = q.tolerance * (1 + 1e-9)
    return any(abs(q.value - r * s) <= tol for r in values for s in SCALES)


def check(doc: Path, root: Path = ROOT) -> tuple[list[str], list[str], list[str]]:
    """-> (problems, unsourced numbers, quoted references); each a line `doc:LINE: ...`."""
    problems, unsourced, references, cache = [], [], [], {}
    current: Citation | None = None
    name = doc.name
    for kind, lines in blocks(doc.read_text().splitlines()):
        if kind == "heading":
            current = None
            continue
        first = lines[0][0]
        text = strip_block("\n".join(ln for _, ln in lines))
        tags = [(first + text.count("\n", 0, m.start()), m.group(1)) for m in TAG.finditer(text)]
        text = TAG.sub(_blank, text)
        for m in REFERENCE.finditer(text):
            n = first + text.count("\n", 0, m.start())
            for i, ln in enumerate(m.group(0).split("\n")):
                references += [f"{name}:{q.line}: {q.text}" for q in quotes_in(ln, n + i)]
        text = REFERENCE.sub(_blank, text)
        if tags:
            current = Citation()
            for n, body in tags:
                c = parse_tag(body)
                current.files += c.files
                current.derived |= c.derived
                current.unsourced = current.unsourced or c.unsourced
                for f in c.files:
                    if not (root / f).is_file():
                        problems.append(f"{name}:{n}: cited file {f} does not exist")
        quotes = [q for i, ln in enumerate(text.split("\n")) for q in quotes_in(ln, first + i)]
        if not quotes:
            continue
        if current is None:
            q = quotes[0]
            problems.append(
                f"{name}:{q.line}: {q.text} (and the block's other numbers): no raw file cited"
            )
            continue
        if current.unsourced is not None and not current.files:
            unsourced += [f"{name}:{q.line}: {q.text} ({current.unsourced})" for q in quotes]
            continue
        values = [
            v for f in current.files if (root / f).is_file() for v in raw_values(root / f, cache)
        ]
        for q in quotes:
            if q.text in current.derived or q.text.lstrip("-") in current.derived:
                continue
            if not matches(q, values):
                problems.append(f"{name}:{q.line}: {q.text} is not in {', '.join(current.files)}")
    return problems, unsourced, references


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("doc", nargs="?", type=Path, default=DOC)
    ap.add_argument("--unsourced", action="store_true", help="also list numbers under raw: none")
    ap.add_argument("--references", action="store_true", help="also list quoted references")
    args = ap.parse_args(argv)
    problems, unsourced, references = check(args.doc)
    for p in problems:
        print(p)
    if args.unsourced:
        for u in unsourced:
            print("unsourced:", u)
    if args.references:
        for r in references:
            print("reference:", r)
    print(
        f"check_benchmark_numbers: {len(problems)} problem(s), {len(unsourced)} unsourced "
        f"number(s), {len(references)} quoted reference(s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
