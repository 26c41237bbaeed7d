"""lab/gpu/regen_prompts.py: the prompt file a device regeneration resumes row for row."""

import json
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from train.data.regenerate import regeneration_prompt

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab" / "gpu"))
from regen_prompts import build, main  # noqa: E402


def chat(cid, *turns):
    roles = ("user", "assistant")
    return {
        "id": cid,
        "messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)],
    }


def write(path: Path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_prompts_are_heldout_once_then_train_per_sample_and_long_ones_dropped(target, tmp_path):
    tok = AutoTokenizer.from_pretrained(target)
    write(tmp_path / "sharegpt-heldout.later.jsonl", [chat("h#1", "q", "a", "q2", "a2")])
    long = " ".join(["word"] * 400)
    train = [chat("t#1", "q", "a", "q2", "a2"), chat("t#2", long, "a", "q2", "a2")]
    write(tmp_path / "sharegpt-train.later.jsonl", train)
    counts = build(tok, tmp_path, ".later", samples=2, max_tokens=64)
    assert counts["kept"] == {"heldout": 1, "train": 1} and counts["rows_written"] == 3
    assert counts["dropped_longer"] == {"heldout": 0, "train": 1}  # its context is too long
    rows = [json.loads(x) for x in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert [(r["id"], r["split"]) for r in rows] == [("h#1", "heldout")] + [("t#1", "train")] * 2
    # the prompt is everything before the answer regeneration replaces, earlier answers included
    assert [m["content"] for m in regeneration_prompt(rows[1])] == ["q", "a", "q2"]
    first = build(tok, tmp_path, ".later", samples=2, max_tokens=64)
    assert first == counts  # same files and samples: the same file, row for row


def test_cli_writes_counts_and_refuses_no_samples(target, tmp_path, capsys):
    for split in ("heldout", "train"):
        write(tmp_path / f"sharegpt-{split}.jsonl", [chat(f"{split}0", "q", "a")])
    out = tmp_path / "counts.json"
    argv = ["--target", str(target), "--data-dir", str(tmp_path), "--json", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text())["rows_written"] == 2
    assert "prompts kept {'heldout': 1, 'train': 1}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main([*argv, "--samples", "0"])
    assert e.value.code == 2


def test_extra_prompts_are_spread_among_the_train_ones(target, tmp_path):
    """A regeneration cut by its time budget keeps each source's share of the answers."""
    tok = AutoTokenizer.from_pretrained(target)
    write(tmp_path / "sharegpt-heldout.jsonl", [chat("h0", "q", "a")])
    write(tmp_path / "sharegpt-train.jsonl", [chat(f"t{i}", "q", "a") for i in range(6)])
    write(tmp_path / "code-train.jsonl", [chat(f"c{i}", "def f():") for i in range(3)])
    counts = build(tok, tmp_path, "", samples=1, max_tokens=64, extra=["code"])
    assert counts["kept"] == {"heldout": 1, "train": 6, "code": 3}
    assert counts["rows_written"] == 10 and counts["extra"] == ["code"]
    rows = [json.loads(x) for x in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert ids == ["h0", "t0", "c0", "t1", "t2", "c1", "t3", "t4", "c2", "t5"]
    assert [r["split"] for r in rows] == ["heldout"] + ["train"] * 9


def test_a_missing_extra_source_is_named(target, tmp_path):
    for split in ("heldout", "train"):
        write(tmp_path / f"sharegpt-{split}.jsonl", [chat(f"{split}0", "q", "a")])
    with pytest.raises(SystemExit) as e:
        main(["--target", str(target), "--data-dir", str(tmp_path), "--extra", "pystdlib"])
    assert e.value.code == 2


def test_extra_only_writes_the_extra_prompts_alone_as_train(target, tmp_path):
    """Code answers on their own (smollm2_regenerate.sh --extra-only): no ShareGPT file is read,
    nothing is held out."""
    tok = AutoTokenizer.from_pretrained(target)
    write(tmp_path / "a-train.jsonl", [chat(f"a{i}", "def f():") for i in range(2)])
    write(tmp_path / "b-train.jsonl", [chat(f"b{i}", "def g():") for i in range(4)])
    counts = build(tok, tmp_path, "", samples=1, max_tokens=64, extra=["a", "b"], extra_only=True)
    assert counts["kept"] == {"heldout": 0, "a": 2, "b": 4} and counts["rows_written"] == 6
    rows = [json.loads(x) for x in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["b0", "a0", "b1", "b2", "a1", "b3"]  # spread evenly
    assert {r["split"] for r in rows} == {"train"} and counts["extra_only"] is True
    with pytest.raises(SystemExit) as e:  # nothing to write
        main(["--target", str(target), "--data-dir", str(tmp_path), "--extra-only"])
    assert e.value.code == 2
