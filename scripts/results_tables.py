"""docs/results.md and the README's results table, generated from docs/results/**/summary.json.

    python scripts/results_tables.py           # rewrite both
    python scripts/results_tables.py --check   # exit 1 naming what is stale, write nothing

Every figure the project quotes lives in one summary.json beside the raw files it was read from,
so no number is typed by hand: this script is the only writer of the tables, and a test runs
`--check`. A summary is flat: a result `KEY` beside its attributes `KEY_source` (the raw file,
relative to the summary's folder; required), `KEY_ci95` (a 95% interval), `KEY_kind` and
`KEY_device` (overriding the summary's top-level `kind` and `device`), plus a free-text `note`.
`kind` is "measured" (timed or counted on the device named) or "emulated" (computed from measured
costs under an assumption the note states); a row carries it so an emulation never reads as a
measurement. A key counts as an attribute only when its base key is present, so a result may
itself end in `_device` (the device a raw file names). The README shows at most 8 headline rows,
chosen in HEADLINES below; docs/results.md shows every key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

RESULTS_DIR = Path("docs/results")
RESULTS_MD = Path("docs/results.md")
README = Path("README.md")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
ATTRIBUTES = ("_source", "_ci95", "_kind", "_device")
TOP_LEVEL = ("note", "device", "kind")
KINDS = ("measured", "emulated")

# (run folder under docs/results, key, what the row says): the README's table, in this order.
HEADLINES = [
    ("smollm2", "vllm_speedup_b1", "SmolLM2-135M: vLLM 0.26 decode speed-up, concurrency 1"),
    ("smollm2", "vllm_speedup_b8", "SmolLM2-135M: vLLM 0.26 decode speed-up, concurrency 8"),
    ("smollm2", "vllm_speedup_b32", "SmolLM2-135M: vLLM 0.26 decode speed-up, concurrency 32"),
    ("smollm2", "tau_t0_sharegpt", "SmolLM2-135M: accepted tokens a round, ShareGPT, T=0"),
    ("smollm2", "dspark_over_dflash_t0", "SmolLM2-135M: DSpark over DFlash acceptance, T=0"),
    ("vllm034", "speedup_b1", "SmolLM2-135M: vLLM 0.34 decode speed-up, concurrency 1"),
    ("qwen3_8b", "train_tokens_per_s", "Qwen3-8B shape: trainer tokens/s"),
    ("qwen25_coder_1p5b", "train_tokens_per_s", "Qwen2.5-Coder-1.5B shape: trainer tokens/s"),
]
MAX_HEADLINES = 8


class SummaryError(ValueError):
    """A summary.json that cannot be tabulated (no source, missing raw file, unknown kind)."""


@dataclass(frozen=True)
class Row:
    run: str  # the summary's folder, relative to docs/results
    key: str
    value: object
    ci95: list | None
    kind: str
    device: str
    source: str  # the raw file, relative to docs/results


def in_results_format(s: dict, folder: Path, note: str | None, device: str) -> dict:
    """A run's figures `s` as a summary here: sources relative to the summary's folder, and the
    device and kind (measured) every key carries. For the scripts that write summaries."""
    rel = {
        k: os.path.relpath(v, folder) if k.endswith("_source") and v else v for k, v in s.items()
    }
    return {**({"note": note} if note else {}), "device": device, "kind": "measured", **rel}


def read_rows(summary: Path, results_dir: Path) -> list[Row]:
    """The result rows of one summary.json, checked: each has a raw file that exists."""
    data = json.loads(summary.read_text())
    run = summary.parent.relative_to(results_dir).as_posix()
    rows = []
    for key, value in data.items():
        if key in TOP_LEVEL or any(key.endswith(a) and key[: -len(a)] in data for a in ATTRIBUTES):
            continue
        source = data.get(f"{key}_source")
        if not source:
            raise SummaryError(f"{summary}: {key} has no {key}_source")
        if not (summary.parent / source).is_file():
            raise SummaryError(f"{summary}: {key}_source {source} does not exist")
        kind = data.get(f"{key}_kind", data.get("kind"))
        if kind not in KINDS:
            raise SummaryError(f"{summary}: {key}'s kind is {kind!r}, not one of {KINDS}")
        device = data.get(f"{key}_device", data.get("device"))
        if not device:
            raise SummaryError(f"{summary}: {key} names no device (set device or {key}_device)")
        rows.append(Row(run, key, value, data.get(f"{key}_ci95"), kind, device, f"{run}/{source}"))
    return rows


def read_all(results_dir: Path) -> dict[str, tuple[str, list[Row]]]:
    """run -> (note, rows), runs in path order (nested summaries after their parents)."""
    runs = {}
    for summary in sorted(results_dir.rglob("summary.json")):
        note = json.loads(summary.read_text()).get("note", "")
        rows = read_rows(summary, results_dir)
        runs[rows[0].run if rows else summary.parent.name] = (note, rows)
    return runs


def fmt(value) -> str:
    """A value as a table shows it: 4 significant digits below 1,000, whole numbers above."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:#.4g}"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {fmt(v)}" for k, v in value.items())
    return str(value)


def interval(row: Row) -> str:
    return f"{fmt(row.ci95[0])}-{fmt(row.ci95[1])}" if row.ci95 else ""


def cells(row: Row, link_prefix: str) -> list[str]:
    link = f"[{Path(row.source).name}]({link_prefix}{row.source})"
    return [fmt(row.value), interval(row), row.kind, row.device, link]


def table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in lines]
    return "\n".join(out)


def results_md(runs: dict[str, tuple[str, list[Row]]]) -> str:
    parts = [
        "# Results",
        "",
        "Generated by `python scripts/results_tables.py` from `docs/results/*/summary.json`;",
        "do not edit by hand. Each row links the raw file its value was read from. *measured*:",
        "timed or counted on the device named; *emulated*: computed from measured costs under an",
        "assumption the run's note states.",
    ]
    header = ["key", "value", "95% interval", "kind", "device", "raw file"]
    for run, (note, rows) in runs.items():
        parts += ["", f"## {run}", ""]
        if note:
            parts += [note, ""]
        parts.append(table(header, [[f"`{r.key}`", *cells(r, "results/")] for r in rows]))
    return "\n".join(parts) + "\n"


def headline_rows(runs: dict[str, tuple[str, list[Row]]]) -> list[tuple[str, Row]]:
    if len(HEADLINES) > MAX_HEADLINES:
        raise SummaryError(f"{len(HEADLINES)} headlines, at most {MAX_HEADLINES}")
    by_key = {(r.run, r.key): r for _, rows in runs.values() for r in rows}
    missing = [f"{run}/{key}" for run, key, _ in HEADLINES if (run, key) not in by_key]
    if missing:
        raise SummaryError(f"headline keys not in any summary: {', '.join(missing)}")
    return [(label, by_key[(run, key)]) for run, key, label in HEADLINES]


def readme_block(runs: dict[str, tuple[str, list[Row]]]) -> str:
    header = ["result", "value", "95% interval", "kind", "device", "raw file"]
    lines = [[label, *cells(row, "docs/results/")] for label, row in headline_rows(runs)]
    note = "Generated from `docs/results/` by `python scripts/results_tables.py`; every figure, "
    note += "with its setup, is in [docs/results.md](docs/results.md)."
    return f"{BEGIN}\n{note}\n\n{table(header, lines)}\n{END}"


def with_block(readme: str, block: str, path: Path) -> str:
    """`readme` with the text from the BEGIN line to the END line replaced by `block`."""
    begin, end = readme.find(BEGIN), readme.find(END)
    if begin < 0 or end < begin:
        raise SummaryError(f"{path}: no {BEGIN} ... {END} lines to write the table between")
    return readme[:begin] + block + readme[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if either file is stale")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    a = ap.parse_args(argv)
    try:
        runs = read_all(a.root / RESULTS_DIR)
        readme_path = a.root / README
        wanted = {
            RESULTS_MD: results_md(runs),
            README: with_block(readme_path.read_text(), readme_block(runs), readme_path),
        }
    except (SummaryError, OSError, json.JSONDecodeError) as e:
        print(f"results_tables: {e}", file=sys.stderr)
        return 2
    stale = []
    for rel, text in wanted.items():
        path = a.root / rel
        if not path.exists() or path.read_text() != text:
            stale.append(rel)
            if not a.check:
                path.write_text(text)
    if a.check and stale:
        names = " and ".join(str(p) for p in stale)
        print(f"stale: {names}; run python scripts/results_tables.py", file=sys.stderr)
        return 1
    for rel in stale:
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
