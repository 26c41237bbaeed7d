"""ShareGPT / HumanEval as packaged data sources, on tiny synthetic files written here."""

from __future__ import annotations

import gzip
import json

import pytest

from train.data import load_rows
from train.data import packaged as pk
from train.data.humaneval import INSTRUCTION, humaneval_rows
from train.data.sharegpt import ShareGPTError, is_heldout, sharegpt_splits
from train.prepare.data import main as prepare_data_main


def _conv(cid, *turns):
    return {"id": cid, "conversations": [{"from": f, "value": v} for f, v in turns]}


GOOD = [
    _conv("a_0", ("human", "hi"), ("gpt", "hello"), ("human", "more"), ("gpt", "sure")),
    _conv("b_0", ("system", "be brief"), ("user", "q"), ("chatgpt", "a")),
    _conv("c_0", ("human", "q"), ("bing", "a"), ("human", "q2"), ("bard", "a2")),
    _conv("d_0", ("human", "q"), ("gpt", "a"), ("human", "unanswered")),  # trailing user trimmed
    _conv("e_0", ("human", "q"), ("alien", "?"), ("gpt", "a")),  # unknown role skipped
]
BAD = {
    "no_turns": [_conv("f_0"), _conv("g_0", ("human", "  "), ("gpt", ""))],
    "first_turn_not_user": [_conv("a_1", ("gpt", "continued"), ("human", "ok"), ("gpt", "x"))],
    "not_alternating": [
        _conv("h_0", ("human", "q"), ("gpt", ""), ("human", "q again"), ("gpt", "a")),
        _conv("i_0", ("human", "q"), ("gpt", "a"), ("system", "late"), ("human", "q")),
    ],
    "fewer_than_two_turns": [_conv("j_0", ("human", "only a question"))],
    "malformed": [{"id": 7, "conversations": []}, {"conversations": "x"}],
    "duplicate_id": [_conv("a_0", ("human", "hi"), ("gpt", "again"))],
}


def _truncated_text(objs, tail=True) -> str:
    text = json.dumps(objs, indent=2)
    if not tail:
        return text
    last = json.dumps(_conv("z_0", ("human", "cut"), ("gpt", "off here")), indent=2)
    full = text[:-1].rstrip() + ",\n" + last + "\n]"
    return full[: len(text) + len(last) // 2]  # cut inside the last object


def test_prefix_recovery_and_drop_reasons():
    objs = GOOD + [o for group in BAD.values() for o in group]
    splits, report = sharegpt_splits(_truncated_text(objs), heldout_fraction=0.0)
    r = report.to_dict()
    assert r["objects_decoded"] == len(objs) and r["kept"] == len(GOOD)
    assert r["dropped"] == {"truncated_tail": 1, **{k: len(v) for k, v in BAD.items()}}
    assert r["kept"] + r["dropped_total"] == r["objects_decoded"] + 1
    assert r["skipped_turns"] == {"empty": 3, "trailing_user": 1, "unknown_role": 1}
    assert r["unknown_roles"] == {"alien": 1} and r["bytes_discarded"] > 0
    assert [row["id"] for row in splits["train"]] == ["a_0", "b_0", "c_0", "d_0", "e_0"]
    assert splits["heldout"] == []


def test_roles_normalised_and_turns_first():
    splits, _ = sharegpt_splits(_truncated_text(GOOD), heldout_fraction=0.0)
    rows = {r["id"]: r["messages"] for r in splits["train"]}
    assert [m["role"] for m in rows["b_0"]] == ["system", "user", "assistant"]
    assert [m["role"] for m in rows["c_0"]] == ["user", "assistant"] * 2
    assert rows["d_0"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert rows["e_0"][1] == {"role": "assistant", "content": "a"}
    first, _ = sharegpt_splits(_truncated_text(GOOD), turns="first", heldout_fraction=0.0)
    first = {r["id"]: r["messages"] for r in first["train"]}
    assert first["a_0"] == rows["a_0"][:2] and first["b_0"] == rows["b_0"]


def test_turns_each_gives_a_row_per_answer_and_keeps_the_first_rows_ids():
    text = _truncated_text(GOOD)
    rows = sharegpt_splits(text, heldout_fraction=0.0)[0]["train"]
    whole = {r["id"]: r["messages"] for r in rows}
    first = sharegpt_splits(text, turns="first", heldout_fraction=0.0)[0]["train"]
    each = sharegpt_splits(text, turns="each", heldout_fraction=0.0)[0]["train"]
    assert [r["id"] for r in each] == ["a_0", "a_0#1", "b_0", "c_0", "c_0#1", "d_0", "e_0"]
    assert [r for r in each if "#" not in r["id"]] == first  # answers regenerated for `first` fit
    later = sharegpt_splits(text, turns="later", heldout_fraction=0.0)[0]["train"]
    assert later == [r for r in each if "#" in r["id"]]
    for row in each:
        base = row["id"].split("#")[0]
        assert row["messages"] == whole[base][: len(row["messages"])]  # a prefix of the chat
        assert row["messages"][-1]["role"] == "assistant"
    assert each[1]["messages"] == whole["a_0"] and each[4]["messages"] == whole["c_0"]
    # one side of the split per conversation, whatever its number of rows
    splits, _ = sharegpt_splits(text, turns="each", heldout_fraction=0.5, seed=3)
    sides = {side: {r["id"].split("#")[0] for r in rows} for side, rows in splits.items()}
    assert not sides["train"] & sides["heldout"] and sides["train"] | sides["heldout"] == set(whole)


def test_closed_array_has_no_tail_and_corruption_is_an_error():
    _, report = sharegpt_splits(_truncated_text(GOOD, tail=False))
    assert "truncated_tail" not in report.to_dict()["dropped"]
    with pytest.raises(ShareGPTError, match="corrupt"):
        sharegpt_splits('[{"id": "a", "conversations": [}, {"id": "b"}]')
    with pytest.raises(ShareGPTError, match="JSON array"):
        sharegpt_splits('{"id": "a"}')


def test_split_is_disjoint_stable_and_keeps_chunks_together():
    objs = [_conv(f"c{i}_{k}", ("human", "q"), ("gpt", "a")) for i in range(1500) for k in (0, 1)]
    text = _truncated_text(objs, tail=False)
    a, _ = sharegpt_splits(text, heldout_fraction=0.1)
    b, _ = sharegpt_splits(text, heldout_fraction=0.1)
    ids = {k: {r["id"] for r in v} for k, v in a.items()}
    assert a == b and not ids["train"] & ids["heldout"]
    assert len(ids["train"]) + len(ids["heldout"]) == 3000
    assert abs(len(ids["heldout"]) / 2 - 150) < 4 * (1500 * 0.1 * 0.9) ** 0.5  # binomial, 4 sigma
    for cid in ids["heldout"]:  # the other chunk of the same chat is held out too
        assert cid[:-1] + ("1" if cid.endswith("0") else "0") in ids["heldout"]
    sub, _ = sharegpt_splits(_truncated_text(objs[::3], tail=False), heldout_fraction=0.1)
    assert {r["id"] for r in sub["heldout"]} == ids["heldout"] & {o["id"] for o in objs[::3]}
    other, _ = sharegpt_splits(text, heldout_fraction=0.1, seed=1)
    assert {r["id"] for r in other["heldout"]} != ids["heldout"]
    assert is_heldout("x_3", 0, 1.0 - 1e-12) and not is_heldout("x_3", 0, 0.0)


def _humaneval_gz(path):
    tasks = [
        {"task_id": "HumanEval/0", "prompt": "def f(x):\n    '''double'''\n", "test": "t"},
        {"task_id": "HumanEval/1", "prompt": "def g():\n", "entry_point": "g"},
    ]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(t) for t in tasks) + "\n")
    return path, tasks


def test_humaneval_rows(tmp_path):
    path, tasks = _humaneval_gz(tmp_path / "HumanEval.jsonl.gz")
    rows = humaneval_rows(path)
    assert [r["id"] for r in rows] == ["HumanEval/0", "HumanEval/1"]
    assert rows[0]["messages"] == [{"role": "user", "content": INSTRUCTION + tasks[0]["prompt"]}]


@pytest.fixture
def sharegpt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "sg.json"
    objs = GOOD + [_conv(f"k{i}_0", ("human", f"q{i}"), ("gpt", f"a{i}")) for i in range(200)]
    path.write_text(_truncated_text(objs))
    return path


def test_load_rows_materialises_once_into_the_cache(sharegpt_file, monkeypatch):
    spec = f"sharegpt:heldout?file={sharegpt_file}&heldout_fraction=0.1"
    held = load_rows(spec)
    train = load_rows(spec.replace(":heldout", ":train"))  # same options: same cache entry
    assert len(held) + len(train) == 205 and 5 <= len(held) <= 40
    assert not {r["id"] for r in held} & {r["id"] for r in train}
    first = spec + "&turns=first"
    assert pk.materialize(first).parent != pk.materialize(spec).parent  # options are in the key
    assert all(len(r["messages"]) == 2 for r in load_rows(first))
    monkeypatch.setattr(pk, "write_prepared", lambda *a, **k: pytest.fail("rebuilt"))
    assert load_rows(spec)["id"] == held["id"]
    for bad, match in [
        ("sharegpt:train?tunrs=first", "unknown option 'tunrs'"),
        ("sharegpt:train?seed=one", "option seed='one'"),
        (spec.replace(":heldout", ":dev"), "no split 'dev'"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_rows(bad)


def test_prepare_data_cli_writes_gzip_that_load_rows_reads(sharegpt_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["sharegpt", "--out", str(out), "--file", str(sharegpt_file), "--turns", "first"]
    assert prepare_data_main([*argv, "--gzip", "--heldout-fraction", "0.1"]) == 0
    report = json.loads((out / "sharegpt-report.json").read_text())
    assert report["dropped"] == {"truncated_tail": 1} and report["options"]["turns"] == "first"
    train = load_rows(str(out / "sharegpt-train.jsonl.gz"))
    assert len(train) == report["splits"]["train"] and "messages" in train.column_names
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    later = tmp_path / "later"
    argv = ["sharegpt", "--out", str(later), "--file", str(sharegpt_file), "--turns", "later"]
    assert prepare_data_main([*argv, "--heldout-fraction", "0.1"]) == 0
    rows = [json.loads(line) for line in (later / "sharegpt-train.jsonl").open()]
    assert rows and all("#" in r["id"] and r["messages"][-1]["role"] == "assistant" for r in rows)
    he, _ = _humaneval_gz(tmp_path / "he.jsonl.gz")
    assert prepare_data_main(["humaneval", "--out", str(out), "--file", str(he)]) == 0
    assert len(load_rows(str(out / "humaneval-heldout.jsonl"))) == 2
    capsys.readouterr()
    assert prepare_data_main(["humaneval", "--out", str(out), "--file", str(tmp_path / "no")]) == 2
    assert str(tmp_path / "no") in capsys.readouterr().err


def test_write_jsonl_gzips_by_the_destination_not_the_temp_name(tmp_path):
    """It writes a temp file (.NAME.tmp-PID) and renames it: the destination's suffix decides the
    gzip, a write that fails leaves the earlier file, and nothing is left beside it."""
    rows = [{"id": "a", "text": "é"}, {"id": "b"}]
    pk.write_jsonl(rows, tmp_path / "x.jsonl.gz")
    plain = tmp_path / "z.jsonl"
    pk.write_jsonl(rows, plain)
    with gzip.open(tmp_path / "x.jsonl.gz", "rt", encoding="utf-8") as f:
        assert [json.loads(ln) for ln in f] == rows
    assert [json.loads(ln) for ln in plain.read_text(encoding="utf-8").splitlines()] == rows
    with pytest.raises(TypeError):
        pk.write_jsonl([{"bad": object()}], plain)
    assert [json.loads(ln) for ln in plain.read_text(encoding="utf-8").splitlines()] == rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl.gz", "z.jsonl"]
