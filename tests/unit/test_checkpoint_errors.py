"""A model folder that cannot be read is one line naming the file, never a traceback: truncated or
corrupt safetensors files (expected and actual sizes), a config.json that is not JSON, an empty or
partial target folder (what is missing). `common.checkpoint_errors.CheckpointFileError`, as the
readers raise it and `serve.check` / `train.publish.push` print it."""

import shutil

import pytest

from common.checkpoint import load_checkpoint
from common.checkpoint_errors import (
    CheckpointFileError,
    check_model_folder,
    check_safetensors_file,
)
from serve.check import main as serve_check
from tests.unit.test_model_card import write_tiny_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    return write_tiny_checkpoint(tmp_path / "draft")


def truncate(path, drop: int) -> tuple[int, int]:
    """Cut `drop` bytes off the end of `path`; -> (size before, size after), measured here."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - drop])
    return len(data), len(data) - drop


def test_a_truncated_weights_file_names_its_expected_and_actual_size(ckpt):
    weights = ckpt / "model.safetensors"
    whole, cut = truncate(weights, 100)
    message = (
        f"{weights} is truncated: expected {whole} bytes (from its safetensors header), found "
        f"{cut}; copy or download it again"
    )
    with pytest.raises(CheckpointFileError) as e:
        check_safetensors_file(weights)
    assert str(e.value) == message
    with pytest.raises(CheckpointFileError) as e:
        load_checkpoint(ckpt)
    assert str(e.value) == message


def test_a_file_longer_than_its_header_says_is_corrupt(ckpt):
    weights = ckpt / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "ab") as f:
        f.write(b"\0" * 3)
    with pytest.raises(CheckpointFileError, match=f"corrupt.*expected {whole} bytes.*{whole + 3}"):
        check_safetensors_file(weights)


@pytest.mark.parametrize("keep", [0, 4, 20])  # empty, shorter than the length, cut in the header
def test_a_file_cut_inside_its_header_is_one_line(ckpt, keep):
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:keep])
    with pytest.raises(CheckpointFileError, match=str(weights)) as e:
        check_safetensors_file(weights)
    assert "\n" not in str(e.value)


def test_serve_check_prints_one_line_for_a_truncated_checkpoint(ckpt, capsys):
    weights = ckpt / "model.safetensors"
    whole, cut = truncate(weights, 1)
    assert serve_check([str(ckpt)]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [
        f"{ckpt}: {weights} is truncated: expected {whole} bytes (from its safetensors header), "
        f"found {cut}; copy or download it again"
    ]
    assert "Traceback" not in out.err


def test_a_config_that_is_not_json_is_one_line(ckpt, capsys):
    (ckpt / "config.json").write_text("{oops")
    with pytest.raises(CheckpointFileError, match=r"config.json is not valid JSON"):
        load_checkpoint(ckpt)
    assert serve_check([str(ckpt)]) == 1
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_an_empty_target_folder_names_what_is_missing(tmp_path):
    empty = tmp_path / "target"
    empty.mkdir()
    with pytest.raises(CheckpointFileError) as e:
        check_model_folder(empty, "target")
    assert str(e.value) == (
        f"target folder {empty} is empty: missing config.json, weights (model.safetensors or "
        "pytorch_model.bin), a tokenizer (tokenizer.json or tokenizer.model or vocab.json) (a "
        "Hugging Face model folder as save_pretrained or `hf download` writes it)"
    )


def test_a_partial_target_folder_names_what_is_missing(random_target, tmp_path):
    partial = tmp_path / "target"
    shutil.copytree(random_target, partial)
    (partial / "tokenizer.json").unlink()
    with pytest.raises(CheckpointFileError, match=r"is incomplete: missing a tokenizer \("):
        check_model_folder(partial, "target")
    check_model_folder(random_target, "target")  # the whole folder passes
    shutil.copy(random_target / "tokenizer.json", partial)
    weights = partial / "model.safetensors"
    whole, cut = truncate(weights, 10)
    with pytest.raises(CheckpointFileError, match=f"expected {whole} bytes .* found {cut}"):
        check_model_folder(partial, "target")


def test_serve_check_names_a_broken_target_folder(ckpt, tmp_path, capsys):
    (tmp_path / "t").mkdir()
    assert serve_check([str(ckpt), "--target", str(tmp_path / "t")]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{ckpt}: target folder {tmp_path / 't'} is empty: missing config.json")


def test_the_contract_check_returns_the_line_instead_of_raising(ckpt):
    """check_checkpoint (serve.launch and train.publish.push run it) lists the truncated file as
    its one problem."""
    from common.contract import check_checkpoint

    weights = ckpt / "model.safetensors"
    whole, cut = truncate(weights, 5)
    assert check_checkpoint(ckpt) == [
        f"{weights} is truncated: expected {whole} bytes (from its safetensors header), found "
        f"{cut}; copy or download it again"
    ]
