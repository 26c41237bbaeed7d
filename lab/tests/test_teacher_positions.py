"""lab/analysis/teacher_positions.py: how often draft rows share a teacher position, counted on
the trainer's own packed rows and anchors."""

from __future__ import annotations


def test_teacher_positions_script_reports_less_sharing_with_fewer_anchors(target, tmp_path):
    """teacher_positions.py end to end on the tiny target's rows: more anchors share more
    (fewer distinct positions per row), never more positions than rows."""
    import json

    from lab.analysis.teacher_positions import main as positions_main

    out = tmp_path / "t.json"
    args = ["--target", str(target), "--data", str(target / "data" / "train.jsonl")]
    args += ["--experiment", "tiny", "--max-rows", "64", "--batches", "2", "--anchors", "4", "32"]
    assert positions_main([*args, "--json", str(out)]) == 0
    few, many = json.loads(out.read_text())
    assert 0 < many["positions_per_row"] < few["positions_per_row"] <= 1
    assert many["supervised_rows"] > few["supervised_rows"]
