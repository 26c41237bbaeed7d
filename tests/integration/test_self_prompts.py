"""train/prepare/self_prompts.py: user turns the target writes, filtered and counted."""

from __future__ import annotations

import json

import pytest

from train.data.regenerate import regeneration_prompt
from train.prepare.self_prompts import main, template_markers, user_turn_prefix, write_prompts


@pytest.fixture(scope="module")
def tok(target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target)


def test_the_prefix_is_where_a_real_user_turn_starts(tok):
    prefix = user_turn_prefix(tok)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "hello there"}], tokenize=True, return_dict=True
    )["input_ids"]
    assert ids[: len(prefix)] == prefix
    assert tok.decode(ids[len(prefix) :]).strip().startswith("hello there")


def test_a_template_without_a_user_turn_is_refused(tok):
    other = type(tok).from_pretrained(tok.name_or_path)
    other.chat_template = "{{ 'no turns here' }}"
    with pytest.raises(ValueError, match="exactly once"):
        user_turn_prefix(other)


class Scripted:
    """A generator that answers each call with the next scripted batch, recording its calls."""

    def __init__(self, batches):
        self.batches, self.calls = list(batches), []

    def __call__(self, prompts, row_indices, chunk_index):
        self.calls.append((len(prompts), list(row_indices), chunk_index, prompts[0]))
        return self.batches.pop(0)


def test_each_turn_is_kept_or_dropped_for_one_reason():
    gen = Scripted(
        [
            [
                ("Explain photosynthesis to me.", "stop"),
                ("never ended because it ran on and", "length"),
                ("hi", "stop"),
                ("x" * 50, "stop"),
                ("What is <|im_start|> for?", "stop"),
                ("  explain   PHOTOSYNTHESIS to me. ", "stop"),
            ],
            [("Write a haiku about rain.", "stop"), ("Name three rivers in Peru.", "stop")],
        ]
    )
    rows, report = write_prompts(
        gen, [7, 8], count=2, batch_size=6, max_batches=5, markers=["<|im_start|>"],
        min_chars=5, max_chars=40, progress=False,
    )  # fmt: skip
    assert [r["messages"] for r in rows] == [
        [{"role": "user", "content": "Explain photosynthesis to me."}],
        [{"role": "user", "content": "Write a haiku about rain."}],
    ]
    assert [r["id"] for r in rows] == ["self/0", "self/1"]
    assert report["dropped"] == {
        "unfinished": 1, "short": 1, "long": 1, "template": 1, "repeat": 1, "surplus": 1,
    }  # fmt: skip
    assert report["sampled"] == 8 == report["kept"] + sum(report["dropped"].values())
    # one call a batch, each with its own rows and chunk, on the prefix; none once enough are kept
    assert gen.calls == [(6, list(range(6)), 0, [7, 8]), (6, list(range(6, 12)), 1, [7, 8])]
    assert (
        regeneration_prompt(rows[0]) == rows[0]["messages"]
    )  # train.prepare.regenerate answers them


def test_it_stops_after_max_batches_short_of_the_count():
    gen = Scripted([[("same question again?", "stop")] * 3] * 4)
    rows, report = write_prompts(gen, [1], count=5, batch_size=3, max_batches=2, progress=False)
    assert len(rows) == 1 and len(gen.calls) == 2
    assert report["kept"] == 1 and report["dropped"]["repeat"] == 5 and report["asked"] == 5


def test_the_cli_writes_rows_and_report_or_says_it_is_short(target, tmp_path, capsys):
    out = tmp_path / "self-train.jsonl"
    argv = ["--target", str(target), "--out", str(out), "--backend", "hf", "--batch-size", "4"]
    # a random target rarely ends its turn in 3 tokens: it comes back short, and says so
    rc = main([*argv, "--count", "8", "--max-batches", "2", "--max-new-tokens", "3"])
    report = json.loads((tmp_path / "self-train.jsonl.report.json").read_text())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert report["sampled"] == 8 == report["kept"] + sum(report["dropped"].values())
    assert len(rows) == report["kept"] and report["backend"] == "hf"
    assert report["sampling"]["temperature"] == 1.0
    assert (rc == 1) == (report["kept"] < 8)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--count", "0"], "--count must be >= 1"),
        (["--count", "4", "--temperature", "0"], "greedy writes one prompt"),
        (["--count", "4", "--min-chars", "50", "--max-chars", "10"], "over --max-chars"),
    ],
)
def test_bad_options_are_refused_by_name(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit):
        main(["--target", str(tmp_path), "--out", str(tmp_path / "x.jsonl"), *flags])
    assert message in capsys.readouterr().err


def test_template_markers_are_the_special_tokens(tok):
    markers = template_markers(tok)
    assert tok.eos_token in markers and "" not in markers
