"""The data-parallel regeneration's shard files (train.data.regenerate): each shard starts from
the rows an earlier session already answered for it, and joining keeps one line per row index,
drops torn last lines and removes the shard files, against a plain dict built by hand."""

from __future__ import annotations

import json
from pathlib import Path

from train.data.regenerate import join_shards, seed_shard, shard_of, shard_path


def _line(i: int, text: str) -> str:
    return json.dumps({"row_index": i, "response": text}) + "\n"


def _rows(path) -> dict[int, str]:
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        assert row["row_index"] not in out
        out[row["row_index"]] = row["response"]
    return out


def test_seed_then_join_resumes_each_shard_and_keeps_the_first_answer(tmp_path):
    out, n, batch = tmp_path / "train.greedy.jsonl", 3, 2
    restored = {i: f"old{i}" for i in range(0, 9)}
    out.write_text("".join(_line(i, t) for i, t in restored.items()) + '{"row_index": 9, "resp')
    parts = [seed_shard(out, k, n, batch) for k in range(n)]
    for k, part in enumerate(parts):
        assert part == shard_path(out, k, n)
        assert set(_rows(part)) == {i for i in restored if shard_of(i, batch, n) == k}
    assert seed_shard(out, 0, n, batch) == parts[0]  # a second call leaves the shard as it is
    # The engines go on: shard 1 redoes row 2 (a duplicate of a restored row) and tears its last
    # line; shard 2 never started, so its file is gone.
    with open(parts[1], "a", encoding="utf-8") as f:
        f.write(_line(2, "again") + _line(14, "new14") + '{"row_index": 15')
    with open(parts[0], "a", encoding="utf-8") as f:
        f.write(_line(12, "new12"))
    (tmp_path / parts[2].rsplit("/", 1)[1]).unlink()
    report = join_shards(out, n)
    want = {**restored, 12: "new12", 14: "new14"}
    assert _rows(out) == want
    assert report["rows"] == len(want)
    assert report["from"][str(out)] == len(restored)
    assert report["from"][parts[0]] == 1 and report["from"][parts[1]] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_seed_without_restored_rows_gives_a_fresh_shard(tmp_path):
    out = tmp_path / "answers.jsonl"
    part = seed_shard(out, 1, 2, 4)
    assert part == shard_path(out, 1, 2)
    assert not (tmp_path / part.rsplit("/", 1)[1]).exists()
    assert join_shards(out, 2) == {"rows": 0, "from": {}}
    assert out.read_text() == ""
