"""common.atomic_file: a file is replaced whole or left as it was, and its temp file is one the
trainer's leftover sweeps recognise."""

from __future__ import annotations

import fnmatch

import pytest

from common.atomic_file import replaced_whole, temp_beside, write_whole
from train.loop.state import CHECKPOINT_LEFTOVERS, LAST_GOOD_NAME


def test_write_whole_replaces_text_and_bytes_and_leaves_nothing_beside(tmp_path):
    out = tmp_path / "report.json"
    out.write_text("old")
    assert write_whole(out, "néw\n") == out
    assert out.read_text(encoding="utf-8") == "néw\n"
    write_whole(out, b"\x00\x01")
    assert out.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_an_error_midway_keeps_the_previous_file_and_removes_the_temp(tmp_path):
    out = tmp_path / "rows.jsonl"
    out.write_text("kept\n")
    with pytest.raises(RuntimeError), replaced_whole(out) as tmp:
        tmp.write_text("half a ")
        raise RuntimeError("killed mid-write")
    assert out.read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_a_first_write_that_fails_leaves_no_file(tmp_path):
    out = tmp_path / "new.txt"
    with pytest.raises(OSError), replaced_whole(out):
        raise OSError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_the_temp_file_is_hidden_and_swept_as_a_checkpoint_leftover(tmp_path):
    tmp = temp_beside(tmp_path / LAST_GOOD_NAME)
    assert tmp.parent == tmp_path and tmp.name.startswith(".")
    assert any(fnmatch.fnmatch(tmp.name, pat) for pat in CHECKPOINT_LEFTOVERS)
