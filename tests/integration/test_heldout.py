"""Issue 15's goal command on a bare HF folder (no data/ inside): `python -m train.distill
+experiment=tiny target=hf target.path=DIR data.train=FILE` runs to an export that fits its target,
holding out a fixed 2% of FILE (train/data/heldout.py) since the default held-out file is absent.
A held-out file given on purpose must still exist."""

from __future__ import annotations

import json
import random

import datasets
import pytest

from serve import check
from tests.tiny_assets import WORDS, chat_rows, make_tokenizer
from tests.unit.test_families import TINY_RUN, build_target
from train.data.heldout import carve_heldout, is_carved_heldout
from train.distill import main

pytestmark = pytest.mark.usefixtures("torch_single_thread")

ROWS = chat_rows(300, seed=1)  # 5 of them fall in the held-out 2%


def test_carved_split_is_a_property_of_each_row():
    rows = datasets.Dataset.from_list(ROWS)
    train, held = carve_heldout(rows)
    held_rows = list(held)
    assert len(held_rows) == 5 and len(train) + len(held_rows) == len(ROWS)
    assert not {json.dumps(r) for r in held_rows} & {json.dumps(r) for r in train}
    assert held_rows == [r for r in ROWS if is_carved_heldout(r)]  # file order
    # The same rows are held out whatever surrounds them (shuffled, half the file) ...
    shuffled = ROWS[:]
    random.Random(0).shuffle(shuffled)
    again = carve_heldout(datasets.Dataset.from_list(shuffled[:150]))[1]
    assert {json.dumps(r) for r in again} <= {json.dumps(r) for r in held_rows}
    # ... the evaluation reads at most data.heldout_max_rows of them ...
    assert list(carve_heldout(rows, max_heldout=2)[1]) == held_rows[:2]
    # ... and a file too small to hold 2% out trains on every row, with no held-out set.
    small = datasets.Dataset.from_list([r for r in ROWS if not is_carved_heldout(r)][:20])
    kept, none = carve_heldout(small)
    assert none is None and len(kept) == 20


@pytest.fixture(scope="module")
def bare_hf(tmp_path_factory):
    """A Llama folder as the Hub ships it (weights, config, tokenizer; no data/) and a chat file."""
    root = tmp_path_factory.mktemp("goal")
    tok = make_tokenizer([" ".join(WORDS)] * 50)
    build_target("llama", tok).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    train = root / "chats.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return root / "model", train


SMALL = [*TINY_RUN, "trainer.max_steps=2", "trainer.eval_every=2"]


def test_goal_command_on_a_bare_hf_folder(bare_hf, tmp_path, capsys):
    model, train = bare_hf
    assert not (model / "data").exists()
    out = tmp_path / "run"
    goal = ["+experiment=tiny", "target=hf", f"target.path={model}", f"data.train={train}"]
    assert main([*goal, f"output_dir={out}", *SMALL]) == 0
    printed = capsys.readouterr().out
    assert f"data.heldout=auto: no {model}/data/heldout.jsonl: holding out 5 rows" in printed
    assert f"holding out 5 rows of {train} instead" in printed
    assert f"[data] {train} (held-out part): 5 rows read" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval"] is not None and summary["eval_untrained"] is not None
    prov = json.loads((out / "final" / "provenance.json").read_text())
    assert prov["expected_acceptance"]["source"] == "held-out evaluation"
    assert check.main([str(out / "final"), "--target", str(model)]) == 0


def test_a_missing_heldout_given_on_purpose_is_an_error(bare_hf, tmp_path, capsys):
    model, train = bare_hf
    missing = model / "data" / "heldout.jsonl"  # the default's path, but written by the user
    argv = ["+experiment=tiny", "target=hf", f"target.path={model}", f"data.train={train}"]
    rc = main([*argv, f"data.heldout={missing}", f"output_dir={tmp_path / 'run'}", *SMALL])
    assert rc == 2
    assert f"cannot read dataset {str(missing)!r}" in capsys.readouterr().err
