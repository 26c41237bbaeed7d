"""What `scripts/bench_engine.py` benchmarks when given no choice: a trained pair prompted with
the target's held-out rows, or an exit 2 that says how to get one. Never a silent random pair
or random-token prompts (a draft has nothing to predict there: acceptance length ~1). Not a
timed test: the run is one tiny step, its numbers unchecked."""

from __future__ import annotations

import json

import pytest

from scripts import bench_engine
from tests.unit.test_engine_helpers import make_draft, make_target, save_draft, save_target

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def test_no_trained_pair_exits_2_and_says_how_to_make_one(tmp_path, capsys):
    code = bench_engine.main(["--target", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "d")])
    assert code == 2
    err = capsys.readouterr().err
    assert "no trained pair" in err and "quickstart" in err and "--synthetic" in err


def test_a_pair_is_prompted_with_its_held_out_rows(tmp_path, capsys):
    target = make_target(0)
    save_target(target, tmp_path / "t")
    save_draft(make_draft(target), tmp_path / "d")
    args = ["--target", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "d")]
    args += ["--batch", "1", "--max-tokens", "2", "--repeats", "1", "--dtype", "float64"]
    assert bench_engine.main(args) == 2  # no TARGET/data/heldout.jsonl, no --prompts
    assert "no held-out prompts" in capsys.readouterr().err
    rows = [{"messages": [{"role": "user", "content": f"w{i} w{i + 1}"}]} for i in range(3)]
    (tmp_path / "t" / "data").mkdir()
    heldout = tmp_path / "t" / "data" / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench_engine.main(args) == 0
    out = capsys.readouterr().out
    assert f"3 held-out prompts from {heldout}" in out and "held-out prompts," in out
    assert bench_engine.main([*args, "--random-prompts"]) == 0
    assert "random token prompts" in capsys.readouterr().out
