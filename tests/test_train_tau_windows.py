"""scripts/train_tau_windows.py: window means of training-batch tau, each over the first run."""

import json

import pytest

from scripts.train_tau_windows import main


def write_metrics(path, taus, eval_tau=9.0):
    rows = [{"step": s, "split": "train", "analytic_tau": t} for s, t in taus.items()]
    rows.append({"step": max(taus), "split": "eval", "analytic_tau": eval_tau})  # not a batch's
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_windows_average_each_runs_batches_and_divide_by_the_first(tmp_path, capsys):
    write_metrics(tmp_path / "a.jsonl", {1: 1.0, 2: 2.0, 3: 3.0, 4: 5.0})
    write_metrics(tmp_path / "b.jsonl", {1: 2.0, 2: 2.0, 3: 6.0})  # stopped at step 3
    args = [f"a={tmp_path / 'a.jsonl'}", f"b={tmp_path / 'b.jsonl'}"]
    assert main([*args, "--windows", "1-2", "3-4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| steps | a | b | b / a |"
    assert lines[2] == "| 1-2 | 1.500 | 2.000 | 1.333 |"
    assert lines[3] == "| 3-4 | 4.000 | 6.000 | 1.500 |"  # b's window holds step 3 only


def test_bad_windows_and_missing_files_are_refused(tmp_path):
    write_metrics(tmp_path / "a.jsonl", {1: 1.0})
    with pytest.raises(SystemExit):
        main([f"a={tmp_path / 'a.jsonl'}", "--windows", "5-2"])
    with pytest.raises(SystemExit, match="NAME=METRICS"):
        main([f"a={tmp_path / 'none.jsonl'}", "--windows", "1-2"])
