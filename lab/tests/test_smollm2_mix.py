"""lab/gpu/smollm2_mix.sh: the train rows of several sources as one file; a source a time-boxed
regeneration left empty is named and left out, so the draft still trains on the others."""

import json
import shutil
import subprocess
from pathlib import Path

MIX = Path(__file__).resolve().parents[2] / "lab" / "gpu" / "smollm2_mix.sh"


def run_mix(tmp_path, files: dict[str, str], *sources):
    (tmp_path / "lab" / "gpu").mkdir(parents=True)
    shutil.copy(MIX, tmp_path / "lab" / "gpu")
    data = tmp_path / "artifacts" / "smollm2-data"
    data.mkdir(parents=True)
    for name, text in files.items():
        (data / name).write_text(text)
    done = subprocess.run(
        ["bash", "lab/gpu/smollm2_mix.sh", *sources],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    return done, data


def test_an_empty_source_is_left_out_and_named(tmp_path):
    rows = '{"id": "g0"}\n{"id": "g1"}\n'
    done, data = run_mix(tmp_path, {"g.jsonl": rows, "r.jsonl": ""}, "g.jsonl", "r.jsonl")
    assert done.returncode == 0, done.stderr
    assert "no rows in artifacts/smollm2-data/r.jsonl, left out" in done.stderr
    assert (data / "train.mix.jsonl").read_text() == rows
    summary = json.loads((data / "train.mix.jsonl.summary.json").read_text())
    assert [s["file"] for s in summary["mixed_from"]] == ["artifacts/smollm2-data/g.jsonl"]


def test_no_source_with_rows_fails(tmp_path):
    done, data = run_mix(tmp_path, {"r.jsonl": ""}, "r.jsonl", "missing.jsonl")
    assert done.returncode == 2 and "none of r.jsonl missing.jsonl has rows" in done.stderr
    assert not (data / "train.mix.jsonl").exists()
