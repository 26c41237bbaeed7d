"""train.publish.model_card: front matter, draft description, vLLM command per layout,
determinism."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from common.checkpoint import save_checkpoint
from tests.tiny import tiny_model
from train.publish.model_card import write_model_card

RECIPE = {"lr": 6e-4, "steps": 200, "batch": 8, "seq_len": 512, "data": {"name": "chat", "n": 100}}
METRICS = {"analytic_tau": 3.25, "heldout_loss": 1.875}


def write_tiny_checkpoint(out_dir, seed: int = 0, **overrides):
    """A valid canonical checkpoint of the shared tiny draft (reduced vocab of 32 by default)."""
    return save_checkpoint(tiny_model(seed, **{"draft_vocab_size": 32, **overrides}), out_dir)


def _card(tmp_path, *, acceptance=None, repo_id="org/tiny-dspark", target="Qwen/Qwen3-8B", **cfg):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", **cfg)
    n = 4 if cfg.get("sample_from_anchor", True) else 3
    acc = [0.9, 0.8, 0.7, 0.6][:n] if acceptance is None else acceptance
    path = write_model_card(
        ckpt,
        target=target,
        recipe=RECIPE,
        metrics=METRICS,
        per_position_acceptance=acc,
        repo_id=repo_id,
    )
    return ckpt, path.read_text()


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def _spec_config(text: str) -> dict:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("vllm serve ")]
    argv = shlex.split(line)
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_front_matter_and_sections(tmp_path):
    ckpt, text = _card(tmp_path)
    assert (ckpt / "README.md").is_file()
    meta = _front_matter(text)
    assert meta["library_name"] == "vllm"
    assert meta["base_model"] == "Qwen/Qwen3-8B"
    assert meta["tags"] == ["dspark", "speculative-decoding", "vllm"]
    for needle in (
        "| Layout | anchor-first: 4 drafts per block of 4 |",
        "| Block size | 4 |",
        "| Speculative tokens | 4 |",
        "| Markov head | vanilla, rank 8 |",
        "| Confidence head | yes (hidden + Markov embedding) |",
        "| Draft vocab | 32 of 96 target tokens (d2t map ships) |",
        "| lr | 0.0006 |",
        "| steps | 200 |",
        "| data.name | chat |",
        "| analytic_tau | 3.25 |",
        "| heldout_loss | 1.875 |",
        "| 2 | 0.8 | 0.72 |",
        "| 4 | 0.6 | 0.3024 |",
        "Implied mean acceptance length (incl. the bonus token): 3.4264.",
        "hf download org/tiny-dspark --local-dir tiny-dspark",
        "python -m serve.launch target=Qwen/Qwen3-8B checkpoint=tiny-dspark",
    ):
        assert needle in text, needle


def test_vllm_command_anchor_first_with_confidence(tmp_path):
    _, text = _card(tmp_path)
    assert _spec_config(text) == {
        "method": "dspark",
        "model": "org/tiny-dspark",
        "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic",
    }
    assert '"enable_adaptive_verification": true' in text  # offered, not on by default
    assert text.count("vllm serve Qwen/Qwen3-8B --speculative-config '{") == 1


def test_vllm_command_one_plus_n_without_confidence(tmp_path):
    _, text = _card(tmp_path, sample_from_anchor=False, enable_confidence_head=False)
    spec = _spec_config(text)
    assert spec["num_speculative_tokens"] == 3  # B - 1 for the 1+N layout
    assert "enable_adaptive_verification" not in spec
    assert "| Confidence head | no |" in text
    assert "1+N (bonus anchor): 3 drafts per block of 4" in text


def test_local_target_and_no_repo_id(tmp_path):
    ckpt, text = _card(tmp_path, repo_id=None, target="/models/my target", draft_vocab_size=None)
    assert "base_model" not in _front_matter(text)  # a local path is not a Hub id
    assert _spec_config(text)["model"] == str(ckpt.resolve())
    assert "'/models/my target'" in text  # shell-quoted in both commands
    assert "hf download" not in text
    assert "| Draft vocab | full target vocab (96) |" in text


def test_deterministic(tmp_path):
    ckpt, first = _card(tmp_path)
    again = write_model_card(
        ckpt,
        target="Qwen/Qwen3-8B",
        recipe=RECIPE,
        metrics=METRICS,
        per_position_acceptance=[0.9, 0.8, 0.7, 0.6],
        repo_id="org/tiny-dspark",
    ).read_text()
    assert again == first
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "provenance.json",
    ]


@pytest.mark.parametrize(
    "acceptance, match",
    [
        ([0.9, 0.8, 0.7], "has 3 values but the checkpoint drafts 4"),
        ([0.9, 1.2, 0.5, 0.4], r"\[0, 1\]"),
    ],
)
def test_bad_acceptance_refused(tmp_path, acceptance, match):
    with pytest.raises(ValueError, match=match):
        _card(tmp_path, acceptance=acceptance)
    assert not (tmp_path / "ckpt" / "README.md").exists()


def test_unmeasured_acceptance(tmp_path):
    _, text = _card(tmp_path, acceptance=[])
    assert "## Per-position acceptance\n\nNot measured." in text
