"""Checkpoint I/O: round trips in both layouts, bf16 export, provenance, atomic overwrite."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from importlib import metadata

import pytest
import torch
from safetensors.torch import load_file

import common.checkpoint
from common.checkpoint import (
    CONFIG_NAME,
    PROVENANCE_NAME,
    WEIGHTS_NAME,
    load_checkpoint,
    read_config,
    save_checkpoint,
)
from tests.conftest import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def batch():
    gen = torch.Generator().manual_seed(3)
    t = 14
    return (
        torch.randn(2, t, 32, generator=gen),  # fc input = 2 layers x 16
        torch.randint(0, 95, (2, t), generator=gen),
        torch.tensor([[0, 4, 9], [2, 3, 8]]),
        torch.ones(2, 3, dtype=torch.bool),
    )


def logits_and_conf(model, batch):
    with torch.no_grad():
        out = model.forward_train(*batch)
        logits = model.block_logits(out.hidden, out.markov_input)
        conf = model.compute_confidence(out.hidden, out.markov_embed)
    return logits, conf


def target_tables(model) -> dict[str, torch.Tensor]:
    """What a loader takes from the target for a lean export (tiny_model's tables are the
    target's: the embedding, and for a full vocab the lm_head)."""
    return {
        "target_embed": model.embed_tokens.weight.detach().clone(),
        "target_lm_head": model.lm_head.weight.detach().clone(),
    }


def files(d: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("fmt", ["canonical", "speculators"])
@pytest.mark.parametrize("draft_vocab", [None, 40], ids=["full_vocab", "reduced_vocab"])
def test_fp32_round_trip_gives_identical_logits(tmp_path, batch, fmt, draft_vocab):
    model = tiny_model(draft_vocab_size=draft_vocab, markov_head_type="gated")
    out = save_checkpoint(model, tmp_path / "ckpt", fmt=fmt, dtype=torch.float32, verifier="tgt")
    back = load_checkpoint(out, **target_tables(model))
    assert dataclasses.asdict(back.config) == dataclasses.asdict(model.config)
    assert dataclasses.asdict(read_config(out)) == dataclasses.asdict(model.config)
    for a, b in zip(logits_and_conf(model, batch), logits_and_conf(back, batch), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(back.d2t, model.d2t) and torch.equal(back.t2d, model.t2d)
    keys = set(load_file(str(out / WEIGHTS_NAME)))
    assert ("d2t" in keys) == (draft_vocab is not None)  # vLLM has no d2t for a full vocab


def test_speculators_config_keys(tmp_path):
    model = tiny_model(sample_from_anchor=False)
    out = save_checkpoint(model, tmp_path / "s", fmt="speculators", verifier="Qwen/Qwen3-8B")
    raw = json.loads((out / CONFIG_NAME).read_text())
    spec = raw["speculators_config"]
    assert spec["algorithm"] == raw["speculators_model_type"] == "dspark"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 3  # B-1 for 1+N
    assert spec["verifier"]["name_or_path"] == "Qwen/Qwen3-8B"
    assert raw["aux_hidden_state_layer_ids"] == [2, 4]  # target_layer_ids + 1
    assert raw["sample_from_anchor"] is False and raw["dspark_bonus_anchor"] is True
    assert raw["transformer_layer_config"]["hidden_size"] == 32
    assert read_config(out).sample_from_anchor is False


def test_verifier_is_written_to_load_from_anywhere(tmp_path, monkeypatch):
    """`verifier.name_or_path`: a hub-cache snapshot (`models--ORG--NAME/snapshots/SHA`, reached
    by any path, relative too) becomes its hub id; another local folder its absolute path; a string
    that is no folder is kept as given (a hub id)."""
    from common.checkpoint import verifier_name_or_path

    snapshot = tmp_path / "hub" / "models--Org--Some-Model-1B" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / CONFIG_NAME).write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    linked = tmp_path / "alias"
    linked.symlink_to(snapshot, target_is_directory=True)
    local = tmp_path / "my-target"
    local.mkdir()
    monkeypatch.chdir(tmp_path)
    assert verifier_name_or_path(str(snapshot)) == "Org/Some-Model-1B"
    assert verifier_name_or_path("hub/models--Org--Some-Model-1B/snapshots/" + "0" * 40) == (
        "Org/Some-Model-1B"
    )
    assert verifier_name_or_path("alias") == "Org/Some-Model-1B"
    assert verifier_name_or_path("my-target") == str(local.resolve())
    assert verifier_name_or_path("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert verifier_name_or_path(None) == ""
    # Negative control: a folder named like a snapshot outside a models-- cache stays a path.
    stray = tmp_path / "snapshots" / "abc"
    stray.mkdir(parents=True)
    assert verifier_name_or_path(str(stray)) == str(stray.resolve())

    out = save_checkpoint(tiny_model(), tmp_path / "s", fmt="speculators", verifier=str(snapshot))
    verifier = json.loads((out / CONFIG_NAME).read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "Org/Some-Model-1B", "architectures": ["LlamaForCausalLM"]}


def test_bf16_export_loads_close(tmp_path, batch):
    model = tiny_model(draft_vocab_size=40)
    out = save_checkpoint(model, tmp_path / "bf16", dtype=torch.bfloat16)
    tensors = load_file(str(out / WEIGHTS_NAME))
    assert tensors["fc.weight"].dtype == torch.bfloat16
    assert tensors["confidence_head.proj.weight"].dtype == torch.float32
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    back = load_checkpoint(out, **target_tables(model))  # fp32 model from bf16 weights
    ref_logits, ref_conf = logits_and_conf(model, batch)
    logits, conf = logits_and_conf(back, batch)
    assert not torch.equal(logits, ref_logits)  # it really went through bf16
    torch.testing.assert_close(logits, ref_logits, rtol=0.05, atol=0.05)
    torch.testing.assert_close(conf, ref_conf, rtol=0.02, atol=0.02)
    bf = load_checkpoint(
        out, dtype=torch.bfloat16, **target_tables(model)
    )  # serving-like dtype; confidence stays fp32
    assert bf.fc.weight.dtype == torch.bfloat16
    assert bf.confidence_head.proj.weight.dtype == torch.float32


@pytest.mark.parametrize("draft_vocab", [None, 40], ids=["full_vocab", "reduced_vocab"])
def test_lean_export_needs_the_target_tables(tmp_path, batch, draft_vocab):
    """The export holds only what the draft owns: never the embedding, the lm_head only for a
    reduced vocab (its rows are the draft's own); loading fills the rest from the target."""
    model = tiny_model(draft_vocab_size=draft_vocab)
    out = save_checkpoint(model, tmp_path / "lean", dtype=torch.float32)
    keys = set(load_file(str(out / WEIGHTS_NAME)))
    assert "embed_tokens.weight" not in keys
    assert ("lm_head.weight" in keys) == (draft_vocab is not None)
    with pytest.raises(ValueError, match="target_embed"):
        load_checkpoint(out)
    if draft_vocab is None:
        with pytest.raises(ValueError, match="target_lm_head"):
            load_checkpoint(out, target_embed=model.embed_tokens.weight.detach())
    back = load_checkpoint(out, **target_tables(model))
    assert torch.equal(logits_and_conf(back, batch)[0], logits_and_conf(model, batch)[0])
    full = save_checkpoint(
        model, tmp_path / "full", dtype=torch.float32, include_embed=True, include_lm_head=True
    )
    assert {"embed_tokens.weight", "lm_head.weight"} <= set(load_file(str(full / WEIGHTS_NAME)))
    assert torch.equal(
        logits_and_conf(load_checkpoint(full), batch)[0], logits_and_conf(model, batch)[0]
    )


def test_provenance(tmp_path):
    model = tiny_model(draft_vocab_size=40)
    out = save_checkpoint(model, tmp_path / "p", provenance={"vocab_counts_hash": "abc123"})
    prov = json.loads((out / PROVENANCE_NAME).read_text())
    assert prov["dspark_config"] == json.loads(json.dumps(model.config.to_hf_dict()))
    assert isinstance(prov["command"], str) and prov["command"]
    assert re.fullmatch(r"[0-9a-f]{40}", prov["git_sha"])
    assert {"python", "torch", "transformers", "safetensors"} <= set(prov["packages"])
    assert prov["packages"]["torch"] == metadata.version("torch")
    assert prov["vocab_counts_hash"] == "abc123"
    assert (out.stat().st_mode & 0o777) == 0o755  # readable by a server running as another user


def leftovers(parent: pathlib.Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name != name)


def test_overwrite_replaces_and_cleans_up(tmp_path, batch):
    out = save_checkpoint(tiny_model(seed=1), tmp_path / "ckpt", dtype=torch.float32)
    second = tiny_model(seed=2)
    save_checkpoint(second, out, dtype=torch.float32)
    back = load_checkpoint(out, **target_tables(second))
    assert torch.equal(logits_and_conf(back, batch)[0], logits_and_conf(second, batch)[0])
    assert leftovers(tmp_path, "ckpt") == []
    with pytest.raises(FileExistsError):
        save_checkpoint(second, out, overwrite=False)


def test_failed_validation_leaves_old_folder_intact(tmp_path, monkeypatch):
    out = save_checkpoint(tiny_model(seed=1), tmp_path / "ckpt")
    before = files(out)
    monkeypatch.setattr(common.checkpoint, "check_checkpoint", lambda d, **kw: ["boom"])
    with pytest.raises(ValueError, match="boom"):
        save_checkpoint(tiny_model(seed=2), out)
    assert files(out) == before
    assert leftovers(tmp_path, "ckpt") == []


def test_failure_while_writing_weights_leaves_old_folder_intact(tmp_path, monkeypatch):
    out = save_checkpoint(tiny_model(seed=1), tmp_path / "ckpt")
    before = files(out)

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("common.checkpoint.save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tiny_model(seed=2), out)
    assert files(out) == before
    assert leftovers(tmp_path, "ckpt") == []


def test_failed_final_rename_restores_old_folder(tmp_path, monkeypatch):
    out = save_checkpoint(tiny_model(seed=1), tmp_path / "ckpt")
    before = files(out)
    real_rename = pathlib.Path.rename

    def rename(self, target):
        if self.name.startswith(".ckpt.tmp-"):  # the new folder's move into place
            raise OSError("rename failed")
        return real_rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", rename)
    # The two-rename fallback (filesystems without an atomic exchange) must restore the old folder.
    monkeypatch.setattr("common.checkpoint._exchange_dirs", lambda a, b: False)
    with pytest.raises(OSError, match="rename failed"):
        save_checkpoint(tiny_model(seed=2), out)
    assert files(out) == before
    assert leftovers(tmp_path, "ckpt") == []
