"""Headline figures of one vLLM serving run, each read from the raw file it comes from.

    python lab/analysis/vllm_serve_summary.py RESULTS [--also DIR ...] [--prefix vllm034_]
                                              [--note TEXT]
                                         [--out FILE]

Reads, under the results folder (what lab/gpu/smollm2_serve.sh, smollm2_gate.sh and
vllm034_tests.sh write): vllm_speedup.json (scripts/vllm_speedup_table.py: decode speed-up over
target-only and vLLM's acceptance length per concurrency and variant), PREFIXgate.json and
PREFIXgate_adaptive.json (lab/gpu/vllm_vs_engine.py) and PREFIXtests.xml (JUnit of tests/vllm).
A run that did not produce one of these files (e.g. only the adaptive gate) takes it from the first
--also folder that holds it (an earlier run). Writes --out (default RESULTS/summary.json): every key
beside `KEY_source`, the file it was read from; a figure whose file is nowhere is null rather than
left out.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.results_tables import in_results_format  # noqa: E402


def load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def junit_counts(path: Path) -> dict | None:
    """{'tests', 'failures', 'errors', 'skipped'} summed over a JUnit file's test suites."""
    if not path.is_file():
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    keys = ("tests", "failures", "errors", "skipped")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}


def summary(res: Path, prefix: str, also: tuple[Path, ...] = ()) -> dict:
    out: dict = {}

    def find(name: str) -> Path:
        """RESULTS/name, else the first --also folder's, else RESULTS/name (absent)."""
        return next((d / name for d in (res, *also) if (d / name).is_file()), res / name)

    def put(key, value, source: Path):
        out[key] = value
        out[f"{key}_source"] = str(source)

    gate_path = find(f"{prefix}gate.json")
    gate = load(gate_path)
    put("vllm_version", gate["vllm_version"] if gate else None, gate_path)
    sp_path = find("vllm_speedup.json")
    rows = {(r["concurrency"], r.get("variant", "dspark")): r for r in load(sp_path) or []}
    for variant, suffix in (("dspark", ""), ("dspark_adaptive", "_adaptive")):
        for c in (1, 8, 32):
            row = rows.get((c, variant))
            put(f"speedup_b{c}{suffix}", row["decode_speedup"] if row else None, sp_path)
        row = rows.get((1, variant))
        put(f"accept_len_b1{suffix}", row["mean_acceptance_length"] if row else None, sp_path)
    for name, suffix in (("gate", ""), ("gate_adaptive", "_adaptive")):
        path = find(f"{prefix}{name}.json")
        g = load(path)
        put(f"gate_passed{suffix}", all(g["checks"].values()) if g else None, path)
        put(
            f"gate_failed_checks{suffix}",
            [k for k, ok in g["checks"].items() if not ok] if g else None,
            path,
        )
    tests_path = find(f"{prefix}tests.xml")
    put("vllm_tests", junit_counts(tests_path), tests_path)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--also", type=Path, nargs="*", default=[], help="earlier runs' folders")
    ap.add_argument("--prefix", default="vllm034_", help="of the gate and test files")
    ap.add_argument("--note", default=None, help="what run these figures are from")
    ap.add_argument("--device", required=True, help="the card they were measured on")
    ap.add_argument("--out", type=Path, default=None, help="default: RESULTS/summary.json")
    a = ap.parse_args(argv)
    s = summary(a.results, a.prefix, tuple(a.also))
    out = a.out or a.results / "summary.json"
    s = in_results_format(s, out.parent, a.note, a.device)
    out.write_text(json.dumps(s, indent=2) + "\n")
    for k, v in s.items():
        if not k.endswith("_source") and k not in ("note", "device", "kind"):
            print(f"{k:<28} {f'{v:.3f}' if isinstance(v, float) else v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
