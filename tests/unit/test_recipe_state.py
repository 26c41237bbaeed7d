"""train/recipe/state.py: when a stage counts as done, and what a rerun keeps."""

from __future__ import annotations

import json

from train.recipe import state as rs


def _stage(tmp_path):
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"a": 1}\n')
    (folder / "big.bin").write_bytes(b"x" * 100)
    return folder


def test_done_needs_the_same_key_and_intact_outputs(tmp_path, monkeypatch):
    folder = _stage(tmp_path)
    key = rs.stage_key({"seed": 0}, {}, [])
    assert rs.is_done(folder, key) == (False, "not run")
    done = rs.write_done(folder, key, {"seed": 0}, [["cmd"]], 1.0)
    assert set(done["outputs"]) == {"train.jsonl", "big.bin"}
    assert rs.is_done(folder, key) == (True, "")
    assert (
        rs.is_done(folder, rs.stage_key({"seed": 1}, {}, []))[1] == "its inputs or settings changed"
    )
    (folder / "train.jsonl").write_text('{"a": 2}\n')  # same size, other bytes: rehashed
    assert rs.is_done(folder, key) == (False, "output train.jsonl changed")
    (folder / "train.jsonl").write_text('{"a": 1}\n')
    monkeypatch.setattr(rs, "REHASH_BYTES", 10)  # big.bin is now checked by size only
    (folder / "big.bin").write_bytes(b"y" * 100)
    assert rs.is_done(folder, key) == (True, "")
    (folder / "big.bin").write_bytes(b"y" * 99)
    assert rs.is_done(folder, key)[1] == "output big.bin is missing or has another size"


def test_the_key_follows_upstream_digests_and_external_files(tmp_path):
    f = tmp_path / "sharegpt.json"
    f.write_text("[]")
    a = rs.stage_key({}, {"prompts": "d1"}, [f])
    assert a == rs.stage_key({}, {"prompts": "d1"}, [f])
    assert a != rs.stage_key({}, {"prompts": "d2"}, [f])
    f.write_text("[ ]")
    assert a != rs.stage_key({}, {"prompts": "d1"}, [f])


def test_an_unfinished_stage_continues_only_under_its_own_key(tmp_path):
    folder = tmp_path / "regenerate"
    assert rs.prepare_folder(folder, "k1") is False  # nothing to continue
    (folder / "train.jsonl").write_text("row\n")
    assert rs.prepare_folder(folder, "k1") is True  # same key, partial output kept
    assert (folder / "train.jsonl").is_file()
    assert rs.is_done(folder, "k1") == (False, "unfinished")
    assert rs.prepare_folder(folder, "k2") is False  # other key: emptied
    assert not (folder / "train.jsonl").exists()
    assert json.loads((folder / rs.STARTED).read_text())["key"] == "k2"
