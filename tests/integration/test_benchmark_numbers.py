"""docs/benchmarks.md passes its own number check, and the check catches what it should."""

from __future__ import annotations

import json

from scripts.check_benchmark_numbers import DOC, ROOT, check


def test_benchmarks_doc_numbers_match_their_raw_files():
    problems, _, _ = check(DOC)
    assert problems == []


def write(tmp_path, doc: str, raw: dict[str, str]):
    for name, text in raw.items():
        (tmp_path / name).write_text(text)
    path = tmp_path / "doc.md"
    path.write_text(doc)
    return check(path, root=tmp_path)


def test_real_raw_file_rejects_the_old_quote(tmp_path):
    """The serve table once said 2.28 for DSpark at concurrency 1; its raw file says 2.19."""
    raw = "docs/benchmarks/serve_tiny_cpu/dspark_c1.json"
    tau = json.loads((ROOT / raw).read_text())["spec_decode"]["mean_acceptance_length"]
    assert round(tau, 2) == 2.19
    doc = tmp_path / "doc.md"
    for quoted, ok in (("2.28", False), ("2.19", True)):
        doc.write_text(f"# S\nDSpark at concurrency 1: {quoted} (raw: {raw}).\n")
        problems, _, _ = check(doc, root=ROOT)
        assert (problems == []) is ok, problems


def test_rules(tmp_path):
    raw = {"a.json": '{"tau": 1.6505, "rate": 0.0971, "ms": 0.07523, "peak_mib": 9105.3}'}
    doc = "\n".join(
        [
            "# One",
            "tau 1.650, MFU 9.7%, 75.2 ms, 8.9 GiB (raw: a.json).",
            "",
            "| x | y |",
            "|---|---|",
            "| 1.65 | `1.99` in a code span is not a quote |",
            "",
            "A ratio 1.086 and a wrong 1.70 (raw: a.json; derived: 1.086).",
            "",
            "# Two",
            "An uncited 3.14 here.",
            "",
            "Quickstart 4.5 min (raw: none, not committed).",
            "",
            "vLLM 0.26 and torch 2.11 are versions; 2026-12-02 is a date; H200 a name;",
            "1e-3 is checked (raw: a.json).",
            "",
            "Missing (raw: nope.txt).",
        ]
    )
    problems, unsourced, _ = write(tmp_path, doc, raw)
    assert problems == [
        "doc.md:8: 1.70 is not in a.json",
        "doc.md:11: 3.14 (and the block's other numbers): no raw file cited",
        "doc.md:16: 1e-3 is not in a.json",
        "doc.md:18: cited file nope.txt does not exist",
    ]
    assert unsourced == ["doc.md:13: 4.5 (not committed)"]


def test_quoted_references_cover_only_their_own_parentheses(tmp_path):
    """`(paper: ...)` / `(issue: ...)` exempt the numbers inside them and nothing else: a number of
    ours beside a reference, or in a later block, still needs its raw file."""
    raw = {"a.json": '{"tau": 2.132}'}
    doc = "\n".join(
        [
            "# One",
            "The paper's share is 0.2-1.3% of a round (paper: 0.2-1.3%, Qwen3-8B).",
            "",
            "The issue (issue: tau 1.845 after 2,000 steps) against ours, 2.132 (raw: a.json).",
            "",
            "# Two",
            "Ours 2.50 beside a quote (paper: tau 3.10).",
            "",
            "A later block, 2.60, is not covered either.",
            "",
            "`(paper: 9.99)` in a code span is an example, so 7.25 here is uncited.",
        ]
    )
    problems, unsourced, references = write(tmp_path, doc, raw)
    assert problems == [
        "doc.md:2: 0.2 (and the block's other numbers): no raw file cited",
        "doc.md:7: 2.50 (and the block's other numbers): no raw file cited",
        "doc.md:9: 2.60 (and the block's other numbers): no raw file cited",
        "doc.md:11: 7.25 (and the block's other numbers): no raw file cited",
    ]
    assert unsourced == []
    assert references == [
        "doc.md:2: 0.2",
        "doc.md:2: 1.3",
        "doc.md:4: 1.845",
        "doc.md:4: 2,000",
        "doc.md:7: 3.10",
    ]
