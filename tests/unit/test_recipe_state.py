"""train/recipe/state.py: when a stage counts as done, and what a rerun keeps."""

from __future__ import annotations

import json
import shutil

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


def test_scratch_is_not_an_output_so_a_done_stage_survives_its_deletion(tmp_path):
    folder = tmp_path / "distill"
    (folder / "run" / "final").mkdir(parents=True)
    (folder / "run" / "final" / "model.safetensors").write_bytes(b"w" * 10)
    ckpt = folder / "run" / "checkpoints" / "step-000400"
    ckpt.mkdir(parents=True)
    (ckpt / "optimizer.bin").write_bytes(b"o" * 50)
    (folder / "run" / "checkpoints_notes.txt").write_text("not under the scratch folder")
    done = rs.write_done(folder, "k", {}, [], 1.0, scratch=("run/checkpoints",))
    assert set(done["outputs"]) == {"run/final/model.safetensors", "run/checkpoints_notes.txt"}
    assert done["scratch"] == ["run/checkpoints"]
    shutil.rmtree(folder / "run" / "checkpoints")
    assert rs.is_done(folder, "k") == (True, "")
    (folder / "run" / "final" / "model.safetensors").unlink()
    why = rs.is_done(folder, "k")[1]
    assert why == "output run/final/model.safetensors is missing or has another size"


def test_identity_is_the_outputs_digest_unless_the_stage_is_keyed_by_its_settings(tmp_path):
    def target(summary: str, by_key: bool) -> dict:
        folder = tmp_path / f"target-{summary}-{by_key}"
        (folder / "model").mkdir(parents=True)
        (folder / "model" / "model.safetensors").write_bytes(b"same weights")
        (folder / "model" / "prepare_summary.json").write_text(summary)  # the parts' paths
        return rs.write_done(
            folder, "key-of-the-settings", {}, [], 1.0, same_identity_as_key=by_key
        )

    here, there = target("/tmp/a/part1.whl", True), target("/tmp/b/part1.whl", True)
    assert here["outputs_digest"] != there["outputs_digest"]
    assert rs.identity(here) == rs.identity(there) == "key-of-the-settings"
    here, there = target("/tmp/a/part1.whl", False), target("/tmp/b/part1.whl", False)
    assert rs.identity(here) == here["outputs_digest"] != rs.identity(there)
    old = {k: v for k, v in here.items() if k != "identity"}  # done.json from before identities
    assert rs.identity(old) == here["outputs_digest"]


def test_a_named_target_is_keyed_by_its_settings_and_the_tiny_one_by_its_bytes():
    from train.recipe.config import load_recipe
    from train.recipe.stages import STAGE_LIST

    target = {s.name: s for s in STAGE_LIST}["target"]
    assert target.same_identity_as_key(load_recipe("qwen2.5-coder-1.5b-instruct", []))
    assert not target.same_identity_as_key(load_recipe("tiny", []))
    assert {s.name: s for s in STAGE_LIST}["distill"].scratch == ("run/checkpoints",)
