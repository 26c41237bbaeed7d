"""Bad input rows: every reason is counted, and the dropped share gates the run before training.

Counting is checked through `train.data.splits.build_split` (what `train.distill` runs) on a jsonl
file
with one row per reason; the gate through `train.distill.main` (exit code 2 above the share,
training below it).
"""

import json

import pytest

from tests.integration.test_data import make_tokenizer
from tests.integration.test_distill import fast
from train.data.rows import REASONS, BadRowError
from train.data.splits import build_split
from train.distill import main
from train.errors import SetupError

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def chat(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def write(path, rows):
    """Rows are dicts (written as JSON) or raw bytes (written as they are)."""
    path.write_bytes(
        b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)
    )
    return path


def cfg(**kw):
    base = dict(
        split=None,
        seq_len=48,
        packing="pack",
        chat_template=None,
        chat_template_kwargs={},
        on_bad_row="skip",
        max_bad_row_share=1.0,
        num_proc=None,
    )
    return {**base, **kw}


class Cfg(dict):
    __getattr__ = dict.__getitem__


LONG = " ".join(["the quick brown fox"] * 20)
# One row per reason, after 4 good rows. Comments: the count each must add.
ROWS = [GOOD] * 4 + [
    b'{"messages": "\xff\xfe"}',  # not_utf8
    b'{"messages": [}',  # not_json
    b"[1, 2]",  # not_an_object
    {"foo": "bar"},  # no_fields
    chat(("user", "only a question")),  # no_assistant
    chat(("system", "  "), ("user", "hi"), ("assistant", "hello")),  # empty_turn (row kept)
    chat(("user", "   "), ("assistant", "an answer")),  # no_assistant: nothing left to answer
    chat(("bot", "beep"), ("user", "hi"), ("assistant", "hello")),  # unknown_role (row kept)
    chat(("tool", "42"), ("assistant", "the answer")),  # template_rejected
    chat(("user", "q"), ("assistant", LONG)),  # truncated (kept: answer starts within seq_len)
    chat(("user", LONG), ("assistant", "a")),  # skipped for length (prompt fills seq_len)
]
NO_TOOLS = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}"
    "{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def test_every_reason_is_counted_and_printed(tok, tmp_path, capsys):
    path = write(tmp_path / "rows.jsonl", ROWS)
    ds = build_split(Cfg(cfg(chat_template=NO_TOOLS)), str(path), tok, seed=0)
    out = capsys.readouterr().out
    assert f"{len(ROWS)} rows read, {len(ROWS) - 8} used, 7 dropped" in out
    assert "1 skipped for length" in out
    assert "skipped 1 rows for length, not bad rows" in out and "data.seq_len=48" in out
    for reason in ("not_utf8", "not_json", "not_an_object", "no_fields", "template_rejected"):
        assert f"dropped 1 rows: {REASONS[reason]}" in out, reason
    assert f"dropped 2 rows: {REASONS['no_assistant']}" in out
    assert REASONS["malformed"] not in out
    assert f"dropped 1 turns, rows kept: {REASONS['empty_turn']}" in out
    assert f"dropped 1 turns, rows kept: {REASONS['unknown_role']}" in out
    assert f"1 rows {REASONS['truncated']}" in out
    assert "line 5" in out and "line 6" in out  # unparseable lines are named by line number
    docs = sum(max(r) + 1 for r in ds["doc_ids"])
    assert docs == len(ROWS) - 8
    # data.num_proc: the same rows and the same counts from worker processes.
    multi = build_split(Cfg(cfg(chat_template=NO_TOOLS, num_proc=2)), str(path), tok, seed=0)
    assert capsys.readouterr().out == out
    assert multi.to_dict() == ds.to_dict()


def test_strict_mode_stops_at_the_first_bad_line(tok, tmp_path):
    path = write(tmp_path / "rows.jsonl", [GOOD, b"{oops", GOOD])
    with pytest.raises(BadRowError, match=r"rows.jsonl:2 is not json.*on_bad_row=skip"):
        build_split(Cfg(cfg(on_bad_row="error")), str(path), tok, seed=0)


def test_final_turn_only_rows_are_counted(tok, tmp_path, capsys):
    qwen3 = str(__import__("pathlib").Path(__file__).parents[1] / "data/chat_templates/qwen3.jinja")
    two = chat(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"))
    path = write(tmp_path / "rows.jsonl", [GOOD, two, two])
    think = build_split(Cfg(cfg(chat_template=qwen3, seq_len=64)), str(path), tok, seed=0)
    assert f"2 rows {REASONS['final_turn_only']}" in capsys.readouterr().out
    # data.chat_template_kwargs reach the template: without thinking, the empty think block is
    # part of the generation prompt, so it is no longer supervised.
    kwargs = {"enable_thinking": False}
    plain = build_split(
        Cfg(cfg(chat_template=qwen3, chat_template_kwargs=kwargs, seq_len=64)), str(path), tok, 0
    )

    def supervised(ds):
        return "".join(
            tok.decode([t for t, m in zip(r["input_ids"], r["loss_mask"]) if m]) for r in ds
        )

    assert "<think>" in supervised(think) and "<think>" not in supervised(plain)


def test_share_above_the_limit_stops_before_packing_is_used(tok, tmp_path):
    path = write(tmp_path / "rows.jsonl", [GOOD] * 9 + [b"{oops"])  # 10% dropped
    with pytest.raises(SetupError, match=r"1 of 10 rows \(10.0%\).*max_bad_row_share=0.05.*JSON"):
        build_split(Cfg(cfg(max_bad_row_share=0.05)), str(path), tok, seed=0)
    build_split(Cfg(cfg(max_bad_row_share=0.1)), str(path), tok, seed=0)  # at the limit: fine


# ---- through train.distill ---------------------------------------------------------------------


def rows_with_bad(target, tmp_path, bad: int):
    good = [json.loads(x) for x in (target / "data" / "train.jsonl").read_text().splitlines()][:38]
    bad_rows = [b"not json"] * bad
    return write(tmp_path / "train.jsonl", good + bad_rows)


def test_distill_stops_with_exit_2_above_the_share(target, tmp_path, capsys):
    data = rows_with_bad(target, tmp_path, bad=4)  # 4 of 42 rows: 9.5% > 5%
    out = tmp_path / "run"
    assert main(fast(target, out, f"data.train={data}", "trainer.max_steps=1")) == 2
    err = capsys.readouterr().err
    assert "4 of 42 rows" in err and "max_bad_row_share=0.05" in err and "not valid JSON" in err
    assert not (out / "checkpoints").exists()


def test_distill_trains_below_the_share(target, tmp_path, capsys):
    data = rows_with_bad(target, tmp_path, bad=1)  # 1 of 39 rows: 2.6%
    out = tmp_path / "run"
    assert main(fast(target, out, f"data.train={data}", "trainer.max_steps=1")) == 0
    assert "dropped 1 rows: not valid JSON" in capsys.readouterr().out
    assert (out / "final" / "config.json").exists()


def test_a_folder_of_jsonl_files_with_a_bad_line(tok, tmp_path, capsys):
    (tmp_path / "d").mkdir()
    write(tmp_path / "d" / "a.jsonl", [GOOD, GOOD])
    write(tmp_path / "d" / "b.jsonl", [GOOD, b"{oops", GOOD])
    ds = build_split(Cfg(cfg()), str(tmp_path / "d"), tok, seed=0)
    assert "5 rows read, 4 used, 1 dropped" in capsys.readouterr().out
    assert sum(max(r) + 1 for r in ds["doc_ids"]) == 4


# ---- rows skipped for length: good rows, not bad ones -------------------------------------------


def long_prompt(i: int) -> dict:
    """A chat row whose prompt alone is longer than seq_len=48 (so is the start of its answer)."""
    return chat(("user", " ".join(["the quick brown fox"] * (15 + i))), ("assistant", "a b c"))


def keeps_at(tok, row) -> int:
    """The shortest seq_len holding the row's first answer token, from the rendered text (the
    answer located in it), not from the code under test: tokens before the answer, plus one."""
    text = tok.apply_chat_template(row["messages"], tokenize=False)
    start = text.index(row["messages"][-1]["content"], text.index("<|im_start|>assistant"))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    before = tok(text[:start], add_special_tokens=False)["input_ids"]
    assert ids[: len(before)] == before  # the prefix tokenizes on its own as within the whole
    return len(before) + 1


def docs(ds) -> int:
    return sum(max(r) + 1 for r in ds["doc_ids"])


def test_rows_skipped_for_length_are_counted_apart_and_do_not_count_as_bad(tok, tmp_path, capsys):
    long = [long_prompt(i) for i in range(6)]
    path = write(tmp_path / "rows.jsonl", [GOOD] * 34 + long)  # 6 of 40: 15% > 5%
    ds = build_split(Cfg(cfg(max_bad_row_share=0.05)), str(path), tok, seed=0)
    out = capsys.readouterr().out
    need = max(keeps_at(tok, r) for r in long)
    assert "40 rows read, 34 used, 0 dropped (0.0%), 6 skipped for length" in out
    assert (
        "skipped 6 rows for length, not bad rows: their first answer starts past "
        f"data.seq_len=48 (data.seq_len={need} keeps them all)"
    ) in out
    assert docs(ds) == 34
    # The seq_len it names keeps every row, and one less still skips the longest.
    assert docs(build_split(Cfg(cfg(seq_len=need)), str(path), tok, seed=0)) == 40
    assert "for length" not in capsys.readouterr().out
    build_split(Cfg(cfg(seq_len=need - 1)), str(path), tok, seed=0)
    assert "skipped 1 rows for length" in capsys.readouterr().out


def test_a_seq_len_that_skips_most_rows_stops_with_the_one_that_keeps_95_percent(tok, tmp_path):
    long = [long_prompt(i) for i in range(6)]
    rows = [GOOD] * 4 + long  # 6 of 10 skipped: seq_len is wrong for this data
    path = write(tmp_path / "rows.jsonl", rows)
    needs = sorted(keeps_at(tok, r) for r in rows)
    keep95 = needs[-(-95 * len(rows) // 100) - 1]  # the ceil(95% of 10) = 10th shortest
    with pytest.raises(SetupError) as e:
        build_split(Cfg(cfg()), str(path), tok, seed=0)
    assert str(e.value).endswith(
        "data.seq_len=48 is too short for this data: 6 of 10 usable rows (60%) have their first "
        f"answer past it, so only 4 rows are left. data.seq_len={keep95} keeps 95% of them"
    )
    only_long = write(tmp_path / "long.jsonl", long)
    with pytest.raises(SetupError, match=r"6 of 6 usable rows \(100%\).*so no row is left"):
        build_split(Cfg(cfg()), str(only_long), tok, seed=0)


def test_distill_trains_when_some_first_answers_start_past_seq_len(target, tmp_path, capsys):
    """The shape of a raw ShareGPT file: a few rows open with a prompt longer than seq_len."""
    good = [json.loads(x) for x in (target / "data" / "train.jsonl").read_text().splitlines()][:34]
    long = [chat(("user", " ".join(["hello"] * 80)), ("assistant", "hi")) for _ in range(6)]
    data = write(tmp_path / "train.jsonl", good + long)
    out = tmp_path / "run"
    assert main(fast(target, out, f"data.train={data}", "trainer.max_steps=1")) == 0
    assert "skipped 6 rows for length, not bad rows" in capsys.readouterr().out
    assert (out / "final" / "config.json").exists()


def test_a_file_of_invalid_json_lines_ends_in_the_skip_summary(tok, tmp_path, capsys):
    path = write(tmp_path / "rows.jsonl", [b"not json", b"{broken", b"[1, 2]"])
    with pytest.raises(SetupError) as e:
        build_split(Cfg(cfg()), str(path), tok, seed=0)
    assert str(e.value) == (
        f"{path}: no usable rows out of 3: dropped 2 rows: not valid JSON (first: line 1: "
        "Expecting value: line 1 column 1 (char 0)); dropped 1 rows: not a JSON object / dict "
        "(first: line 3: a JSON list, not an object)"
    )
    assert "pyarrow" not in capsys.readouterr().err
