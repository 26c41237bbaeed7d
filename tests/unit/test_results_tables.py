"""scripts/results_tables.py: docs/results.md and the README's table are the summaries' figures.

The repo's own tables must be current (a hand edit or a summary changed without regenerating
fails here), and the check must notice a changed value: both are read independently of the
script's formatting where it matters (the summary's JSON, the emulated label)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from scripts.results_tables import BEGIN, END, main

ROOT = Path(__file__).resolve().parents[2]


def copy_repo_results(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs/results", tmp_path / "docs/results")
    shutil.copy(ROOT / "docs/results.md", tmp_path / "docs/results.md")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


def test_repo_tables_are_current(capsys):
    assert main(["--check", "--root", str(ROOT)]) == 0, capsys.readouterr().err


def test_changed_value_is_stale_until_regenerated(tmp_path, capsys):
    root = copy_repo_results(tmp_path)
    summary = root / "docs/results/smollm2/summary.json"
    data = json.loads(summary.read_text())
    data["vllm_speedup_b1"] = 2.5  # a headline key: both files go stale
    summary.write_text(json.dumps(data, indent=2))
    assert main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "docs/results.md" in err and "README.md" in err
    assert main(["--root", str(root)]) == 0
    assert main(["--check", "--root", str(root)]) == 0
    block = (root / "README.md").read_text().split(BEGIN)[1].split(END)[0]
    assert "| 2.500 |" in block


def test_changed_non_headline_value_stales_results_md_only(tmp_path, capsys):
    root = copy_repo_results(tmp_path)
    summary = root / "docs/results/vllm034/summary.json"
    data = json.loads(summary.read_text())
    data["accept_len_b1"] = 9.75
    summary.write_text(json.dumps(data, indent=2))
    assert main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "docs/results.md" in err and "README.md" not in err


def test_emulated_rows_say_so():
    data = json.loads((ROOT / "docs/results/qwen3_8b/summary.json").read_text())
    md = (ROOT / "docs/results.md").read_text()
    emulated = [k[: -len("_kind")] for k, v in data.items() if k.endswith("_kind")]
    assert "speedup_tau4_b128_adaptive" in emulated
    for key in emulated:
        row = next(line for line in md.splitlines() if line.startswith(f"| `{key}` |"))
        assert "| emulated |" in row


def test_missing_raw_file_is_a_one_line_error(tmp_path, capsys):
    root = copy_repo_results(tmp_path)
    (root / "docs/results/vllm034/matched_2026-12-04/vllm_speedup.json").unlink()
    assert main(["--check", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "vllm_speedup.json does not exist" in err and "\n" not in err


def test_readme_without_markers_is_an_error(tmp_path, capsys):
    root = copy_repo_results(tmp_path)
    (root / "README.md").write_text("# no table here\n")
    assert main(["--root", str(root)]) == 2
    assert BEGIN in capsys.readouterr().err
