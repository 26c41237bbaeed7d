"""train/prepare/trim_repeats.py: answers cut after their first repeated n-gram, against a naive
search;
user turns, loop-free answers and row fields untouched; counts and provenance; bad input."""

import json

import pytest
from transformers import AutoTokenizer

from train.prepare.trim_repeats import first_repeat_end, main


def naive_first_repeat_end(ids, n):
    """Smallest end e such that ids[e-n:e] equals some ids[j:j+n] with j < e-n."""
    for e in range(n, len(ids) + 1):
        if any(ids[j : j + n] == ids[e - n : e] for j in range(e - n)):
            return e
    return None


@pytest.mark.parametrize("seed", range(20))
def test_first_repeat_end_matches_a_naive_search(seed):
    import random

    rng = random.Random(seed)
    ids = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
    for n in (2, 3, 5):
        assert first_repeat_end(ids, n) == naive_first_repeat_end(ids, n)


def test_overlapping_repeat_counts():
    assert first_repeat_end([7, 7, 7], 2) == 3  # (7, 7) at 0 and at 1
    assert first_repeat_end([1, 2, 3, 4], 2) is None


def test_rows_are_cut_after_the_first_repeat(target, tmp_path, capsys):
    tok = AutoTokenizer.from_pretrained(target)
    loop = "the cat sat on the mat and the dog ran " * 6

    def chat(user, answer, **extra):
        return {
            "messages": [
                {"role": "user", "content": user},
                {"role": "assistant", "content": answer},
            ],
            **extra,
        }

    rows = [chat(loop, "hi " + loop, id="a", extra=1), chat("x", "a short answer", id="b")]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "in.jsonl.summary.json").write_text(json.dumps({"temperature": 0.0}))
    assert main([str(src), str(dst), "--target", str(target), "--ngram", "4"]) == 0
    out = [json.loads(x) for x in dst.read_text().splitlines()]
    assert out[0]["messages"][0] == rows[0]["messages"][0]  # the user turn is untouched
    assert out[0]["extra"] == 1 and out[1] == rows[1]  # fields kept; no loop, no cut
    cut = out[0]["messages"][1]["content"]
    full = rows[0]["messages"][1]["content"]
    assert full.startswith(cut) and len(cut) < len(full)
    ids = tok(full, add_special_tokens=False)["input_ids"]
    end = naive_first_repeat_end(ids, 4)
    assert tok(cut, add_special_tokens=False)["input_ids"] == ids[:end]
    summary = json.loads((tmp_path / "out.jsonl.summary.json").read_text())
    assert summary["temperature"] == 0.0  # the source's provenance is kept
    t = summary["trimmed_repeats"]
    assert (t["rows"], t["answers"], t["answers_cut"], t["ngram"]) == (2, 2, 1, 4)
    short = len(tok("a short answer", add_special_tokens=False)["input_ids"])
    assert t["answer_tokens_before"] == len(ids) + short
    assert t["answer_tokens_after"] == end + short
    assert "1 of 2 answers cut" in capsys.readouterr().out


def test_bad_input_is_named_and_nothing_is_written(target, tmp_path, capsys):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"messages": []}\n{"no_messages": 1}\n')
    assert main([str(src), str(dst), "--target", str(target)]) == 2
    assert "in.jsonl:2" in capsys.readouterr().err
    assert not dst.exists() and not (tmp_path / "out.jsonl.summary.json").exists()
    with pytest.raises(SystemExit):
        main([str(src), str(src), "--target", str(target)])
