"""train_tau_windows.py: window means of training-batch tau, each over the first run."""

import json

import pytest

from lab.analysis.train_tau_windows import main


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


def test_heldout_rows_at_a_step_divide_by_the_first_and_mark_what_a_run_lacks(tmp_path, capsys):
    write_metrics(tmp_path / "a.jsonl", {1: 1.0, 2: 1.0}, eval_tau=2.0)  # eval at step 2
    write_metrics(tmp_path / "b.jsonl", {1: 1.0, 2: 1.0}, eval_tau=3.0)
    args = [f"a={tmp_path / 'a.jsonl'}", f"b={tmp_path / 'b.jsonl'}"]
    assert main([*args, "--windows", "1-2", "--heldout", "2", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3] == "| held out at 2, analytic | 2.000 | 3.000 | 1.500 |"
    assert lines[4] == "| held out at 2, greedy | - | - | - |"  # the rows hold no greedy tau
    assert lines[5] == "| held out at 7, analytic | - | - | - |"  # no evaluation at step 7


def test_bad_windows_and_missing_files_are_refused(tmp_path):
    write_metrics(tmp_path / "a.jsonl", {1: 1.0})
    with pytest.raises(SystemExit):
        main([f"a={tmp_path / 'a.jsonl'}", "--windows", "5-2"])
    with pytest.raises(SystemExit, match="NAME=METRICS"):
        main([f"a={tmp_path / 'none.jsonl'}", "--windows", "1-2"])
