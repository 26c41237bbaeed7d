"""train.prepare.target: GGUF -> checked bf16 HF folder, on a tiny random Llama GGUF (seconds), plus
one slow test on the real SmolLM2 wheel when it is available offline."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from tests.tiny_gguf import SMOLLM2_TEMPLATE, tiny_llama, write_tiny_gguf  # noqa: E402
from train.prepare import target as pt  # noqa: E402
from train.publish.package_files import PackageFileError, find_package_file  # noqa: E402

NAME = "smollm2-135m-instruct"  # the registry entry; tests pass their own file with gguf=


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = tiny_llama(seed=0)
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model)
    return model, path


@pytest.fixture(scope="module")
def built(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "target"
    pt.prepare(NAME, out, gguf=tiny[1])
    return out


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def test_end_to_end_matches_the_model_written_into_the_gguf(tiny, built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _ = tiny
    summary = json.loads((built / pt.SUMMARY_NAME).read_text())
    assert summary["params"] == sum(p.numel() for p in model.parameters())
    assert (summary["layers"], summary["hidden_size"], summary["vocab_size"]) == (2, 64, 264)
    assert summary["logit_check"]["reload_max_abs_diff"] == 0.0
    assert pt.is_complete(built)
    saved = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32).eval()
    assert json.loads((built / "config.json").read_text())["dtype"] == "bfloat16"
    assert "quantization_config" not in json.loads((built / "config.json").read_text())
    ids = torch.tensor([[1, 86, 260, 223, 69, 67, 86, 263, 2, 5, 77]])
    with torch.no_grad():  # independent reference: the HF model the GGUF was written from
        diff = (saved(ids).logits - model(ids).logits).abs().max().item()
    assert diff < 1e-5
    tok = AutoTokenizer.from_pretrained(built)
    assert (built / pt.ORIGINAL_TEMPLATE_NAME).read_text() == SMOLLM2_TEMPLATE
    conv = [
        {"role": "user", "content": "the cat"},
        {"role": "assistant", "content": "an ant"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "the end"},
    ]
    out = tok.apply_chat_template(conv, return_dict=True, return_assistant_tokens_mask=True)
    marked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tok.decode(marked) == "an ant<|im_end|>the end<|im_end|>"
    plain = tok.apply_chat_template(conv, chat_template=SMOLLM2_TEMPLATE, tokenize=False)
    assert tok.apply_chat_template(conv, tokenize=False) == plain


def test_complete_dir_is_kept_and_force_rebuilds(tiny, built, capsys):
    before = (built / "model.safetensors").stat().st_mtime_ns
    assert pt.main([NAME, "--out", str(built), "--gguf", str(tiny[1])]) == 0
    assert "already complete" in capsys.readouterr().out
    assert (built / "model.safetensors").stat().st_mtime_ns == before
    pt.prepare(NAME, built, gguf=tiny[1], force=True)
    assert (built / "model.safetensors").stat().st_mtime_ns != before
    assert pt.is_complete(built) and _leftovers(built.parent) == []


def test_incomplete_dir_is_refused(tiny, tmp_path):
    out = tmp_path / "target"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(pt.PrepareError, match="not a complete build"):
        pt.prepare(NAME, out, gguf=tiny[1])


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_gguf_is_a_clear_error(tiny, tmp_path, capsys, cut):
    data = tiny[1].read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: int(len(data) * cut)])
    out = tmp_path / "target"
    assert pt.main([NAME, "--out", str(out), "--gguf", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "truncated" in err
    assert not out.exists() and _leftovers(tmp_path) == []


def test_not_a_gguf_and_missing_file_are_clear_errors(tmp_path, capsys):
    text = tmp_path / "model.gguf"
    text.write_text("this is not a gguf")
    assert pt.main([NAME, "--out", str(tmp_path / "t"), "--gguf", str(text)]) == 2
    assert f"{text}: not a GGUF file" in capsys.readouterr().err
    missing = tmp_path / "missing.gguf"
    assert pt.main([NAME, "--out", str(tmp_path / "t"), "--gguf", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("error", [pt.PrepareError("injected"), KeyboardInterrupt()])
def test_failure_leaves_nothing_half_written(tiny, tmp_path, monkeypatch, error):
    def fail(*a, **k):
        raise error

    monkeypatch.setattr(pt, "check_logits", fail)
    with pytest.raises(type(error)):
        pt.prepare(NAME, tmp_path / "target", gguf=tiny[1])
    assert sorted(os.listdir(tmp_path)) == []


def test_failed_force_rebuild_keeps_the_old_build(tiny, built, monkeypatch):
    monkeypatch.setattr(pt, "check_logits", lambda *a, **k: (_ for _ in ()).throw(KeyError()))
    with pytest.raises(KeyError):
        pt.prepare(NAME, built, gguf=tiny[1], force=True)
    assert pt.is_complete(built) and _leftovers(built.parent) == []


def test_logit_check_catches_a_saved_weight_that_differs(tiny, built):
    """Negative control: a model whose weights differ from the saved dir must fail the check."""
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32).eval()
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight[0, 0] += 0.5
    inputs = [[1, 86, 260, 223, 2]]
    logits = pt._logits(other, inputs)
    with pytest.raises(pt.PrepareError, match="saved weights differ"):
        pt.check_logits(logits, logits, other, built, inputs)


def test_mark_chatml_refuses_an_unknown_template():
    with pytest.raises(pt.PrepareError, match="update TARGETS"):
        pt.mark_chatml("{{ messages }}", pt.SMOLLM2_MESSAGE)
    assert pt.mark_chatml(SMOLLM2_TEMPLATE, pt.SMOLLM2_MESSAGE).count("{% generation %}") == 1


def _fake_wheel(wheel_dir: Path, version: str = "1.0") -> Path:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    whl = wheel_dir / f"fake_data_pkg-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("fake_data_pkg/data/x.txt", f"payload {version}")
    return whl


def test_package_file_from_wheel_dir_and_pip(tmp_path, monkeypatch):
    import train.publish.package_files as pf

    _fake_wheel(tmp_path / "w", "0.9")  # another version: ignored
    with pytest.raises(PackageFileError, match="download off"):
        find_package_file("fake-data-pkg", "1.0", "fake_data_pkg/data/x.txt",
                          wheel_dir=tmp_path / "w", download=False)  # fmt: skip
    calls = []
    monkeypatch.setattr(
        pf, "pip_download", lambda p, v, d: (calls.append((p, v)), _fake_wheel(d, v))
    )
    got = find_package_file("fake-data-pkg", "1.0", "fake_data_pkg/data/x.txt",
                            wheel_dir=tmp_path / "w")  # fmt: skip
    assert calls == [("fake-data-pkg", "1.0")] and got.how.startswith("downloaded wheel")
    assert got.path.read_text() == "payload 1.0"
    again = find_package_file("fake-data-pkg", "1.0", "fake_data_pkg/data/x.txt",
                              wheel_dir=tmp_path / "w")  # fmt: skip
    assert len(calls) == 1 and again.path == got.path and again.how.startswith("wheel")
    with pytest.raises(PackageFileError, match="no member"):
        find_package_file("fake-data-pkg", "1.0", "nope.txt", wheel_dir=tmp_path / "w")


def test_package_file_from_the_installed_package_of_that_version_only(tmp_path):
    import importlib.metadata

    version = importlib.metadata.version("pytest")
    got = find_package_file("pytest", version, "pytest/__init__.py", wheel_dir=tmp_path)
    assert got.how.startswith(f"installed package pytest=={version}") and got.path.is_file()
    with pytest.raises(PackageFileError, match="neither installed nor a wheel"):
        find_package_file("pytest", "0.0.1", "pytest/__init__.py", wheel_dir=tmp_path,
                          download=False)  # fmt: skip


@pytest.mark.slow
def test_real_smollm2_wheel(tmp_path):
    """The real target, built once into the cache (`$DSPARK_CACHE/test-targets`) and reused."""
    from train.publish.package_files import cache_root

    spec = pt.TARGETS[NAME]
    try:
        found = find_package_file(spec.package, spec.version, spec.member, download=False)
    except PackageFileError as e:
        pytest.skip(f"SmolLM2 wheel not available offline: {e}")
    out = cache_root() / "test-targets" / NAME
    pt.prepare(NAME, out, gguf=found.path)
    summary = json.loads((out / pt.SUMMARY_NAME).read_text())
    assert (summary["params"], summary["layers"], summary["vocab_size"]) == (134515008, 30, 49152)
    assert summary["logit_check"]["confident_argmax_agreement"] == 1.0


def test_distill_setup_prepares_a_missing_target_once(tmp_path, monkeypatch):
    """`target.prepare=NAME` calls prepare_target when `path` is missing, never when it exists,
    and turns its error into a SetupError (exit 2 in train.distill)."""
    from omegaconf import OmegaConf

    from train.errors import SetupError
    from train.loop.target import ensure_target

    calls = []
    monkeypatch.setattr(pt, "prepare", lambda name, out: calls.append((name, out)))
    cfg = OmegaConf.create({"path": str(tmp_path / "t"), "build_tiny": False, "prepare": NAME})
    ensure_target(cfg)
    assert calls == [(NAME, str(tmp_path / "t"))]
    (tmp_path / "t").mkdir()
    ensure_target(cfg)
    assert len(calls) == 1

    def fail(name, out):
        raise pt.PrepareError("no wheel")

    monkeypatch.setattr(pt, "prepare", fail)
    cfg.path = str(tmp_path / "u")
    with pytest.raises(SetupError, match="target.prepare='smollm2-135m-instruct': no wheel"):
        ensure_target(cfg)
