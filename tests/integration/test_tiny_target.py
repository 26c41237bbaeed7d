"""The tiny-target builder: a 5-step build on a 40-file corpus, loaded back offline.

Pins: special-token ids, the assistant-mask contract of the chat template (1 on assistant content
and its closing <|im_end|>, 0 elsewhere), the data files, the loss going down, reuse by recipe,
and the quality budget (a time-budget build stops at its held-out loss target; one above its
bound is refused, nothing published).
The mask reference is independent of transformers' offset logic: the rendered chat is tokenized
segment by segment, each segment labelled by hand.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scripts.make_tiny_target import build_tiny_target, main
from train.tiny_target import presets
from train.tiny_target.build import DegenerateTarget
from train.tiny_target.tokenizer import SPECIAL_TOKENS

ARGS = {"steps": 5, "max_files": 40, "seed": 0}

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Continue this Python code from os:\ndef f(x):"},
    {"role": "assistant", "content": "    if x:\n        return 1\n    return 2"},
    {"role": "user", "content": "Continue."},
    {"role": "assistant", "content": "def g():\n    pass"},
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("tt") / "tiny-target"
    return build_tiny_target(out, **ARGS, threads=1)  # 1 thread: immune to a busy shared box


@pytest.fixture(scope="module")
def tok(built):
    return AutoTokenizer.from_pretrained(built.path)


def test_folder_loads_offline(built, tok, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(built.path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert not model.config.tie_word_embeddings
    ids = tok("def f():\n    return 1", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()
    assert sorted(p.name for p in built.path.iterdir() if ".tmp-" in p.name) == []
    assert not list(built.path.parent.glob("*.tmp-*"))  # the temp build was renamed away


def test_special_tokens(tok):
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tok.eos_token, tok.pad_token, tok.mask_token) == (
        "<|im_end|>",
        "<|endoftext|>",
        "<|mask|>",
    )
    assert tok.encode("<|mask|>", add_special_tokens=False) == [3]
    assert tok.encode("a<|mask|><|mask|>b", add_special_tokens=False).count(3) == 2


def _reference(tok, messages):
    """(ids, mask) from tokenizing hand-labelled segments of the rendered chat separately."""
    segments = []
    for m in messages:
        if m["role"] == "assistant":
            segments += [
                ("<|im_start|>assistant\n", 0),
                (m["content"] + "<|im_end|>", 1),
                ("\n", 0),
            ]
        else:
            segments.append((f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n", 0))
    ids, mask = [], []
    for text, label in segments:
        seg = tok.encode(text, add_special_tokens=False)
        ids, mask = ids + seg, mask + [label] * len(seg)
    return ids, mask


def test_assistant_mask_exact(tok):
    out = tok.apply_chat_template(
        CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ref_ids, ref_mask = _reference(tok, CHAT)
    assert out["input_ids"] == ref_ids  # segment boundaries never merge into one token
    assert out["assistant_masks"] == ref_mask
    picked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    want = "".join(m["content"] + "<|im_end|>" for m in CHAT if m["role"] == "assistant")
    assert tok.decode(picked) == want
    prompt = tok.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_data_rows_and_masks(built, tok):
    rows = {
        s: [json.loads(x) for x in (built.path / "data" / f"{s}.jsonl").open()]
        for s in ("train", "heldout")
    }
    assert len(rows["train"]) > 100 and len(rows["heldout"]) > 5
    for split in rows.values():
        assert {r["domain"] for r in split} == {"code", "prose"}
        assert all(r["messages"][-1]["role"] == "assistant" for r in split)
    assert not {r["source"] for r in rows["train"]} & {r["source"] for r in rows["heldout"]}
    for row in rows["train"][::20]:  # mined rows obey the same exact-mask contract
        out = tok.apply_chat_template(
            row["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert (out["input_ids"], out["assistant_masks"]) == _reference(tok, row["messages"])


def test_loss_decreased_and_summary(built):
    s = json.loads((built.path / "train_summary.json").read_text())
    assert s == built.summary and s["steps"] == 5 and s["tokens"] == 5 * 8 * 256
    curve = [loss for _, loss in s["loss_curve"]]
    assert curve[-1] < curve[0]
    assert s["heldout_loss"] < s["uniform_loss"]
    assert s["special_token_ids"]["<|mask|>"] == 3


def test_rerun_reuses(built, capsys):
    before = (built.path / "model.safetensors").stat().st_mtime_ns
    argv = ["--out", str(built.path), "--steps", "5", "--max-files", "40", "--seed", "0"]
    assert main(argv) == 0
    assert "reusing" in capsys.readouterr().out
    assert (built.path / "model.safetensors").stat().st_mtime_ns == before
    assert main([*argv[:2], "--steps", "0"]) == 2  # bad budget: exit code 2, folder untouched
    assert (built.path / "model.safetensors").stat().st_mtime_ns == before


def _quality_preset(monkeypatch, target: float, bound: float) -> None:
    """The tiny preset with a held-out loss target and bound the test chooses, checked every 2
    steps on 8 chats."""
    tiny = presets.PRESETS["tiny"]
    monkeypatch.setitem(
        presets.PRESETS,
        "tiny",
        dataclasses.replace(
            tiny, heldout_loss_target=target, heldout_loss_bound=bound, check_every=2, check_rows=8
        ),
    )


def test_a_time_budget_build_stops_at_the_quality_target(tmp_path, monkeypatch):
    _quality_preset(monkeypatch, target=100.0, bound=100.0)  # met at the first check
    b = build_tiny_target(tmp_path / "tt", minutes=5, max_files=40, seed=0, threads=1)
    s = b.summary
    assert s["stopped_by"] == "quality" and s["steps"] == 2
    assert s["quality_checks"][0][0] == 2 and s["quality_checks"][0][1] < s["uniform_loss"]
    assert s["heldout_loss_bound"] == 100.0


def test_a_degenerate_target_is_refused_not_published(tmp_path, monkeypatch):
    _quality_preset(monkeypatch, target=0.0, bound=1.0)  # unreachable: the cap ends training
    out = tmp_path / "tt"
    with pytest.raises(DegenerateTarget, match="above the bound 1.0"):
        build_tiny_target(out, minutes=0.02, max_files=40, seed=0, threads=1)
    assert not out.exists()
    assert main(["--out", str(out), "--minutes", "0.02", "--max-files", "40"]) == 2
