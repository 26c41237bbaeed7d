"""DSparkConfig: target-derived defaults, validation messages, config.json round trip, layouts."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
from transformers import Qwen3Config

from common.config import AssumedConfigKey, ConfigError, DSparkConfig, default_target_layer_ids
from common.model import block_label_positions
from tests.conftest import tiny_config, tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def qwen3_8b_like() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )


def test_from_target_qwen3_default_layer_ids():
    cfg = DSparkConfig.from_target(qwen3_8b_like(), mask_token_id=151669)
    assert cfg.target_layer_ids == [1, 9, 17, 25, 33]
    assert cfg.target_num_hidden_layers == 36
    assert (cfg.vocab_size, cfg.hidden_size, cfg.target_hidden_size) == (151936, 4096, 4096)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 8, 128)
    assert cfg.rope_theta == 1_000_000.0
    assert cfg.fc_input_size == 5 * 4096
    # A dict works the same and explicit choices win over defaults.
    cfg2 = DSparkConfig.from_target(
        qwen3_8b_like().to_dict(), mask_token_id=5, num_hidden_layers=2, target_layer_ids=[2, 20]
    )
    assert cfg2.target_layer_ids == [2, 20] and cfg2.num_hidden_layers == 2


@pytest.mark.parametrize("n", [4, 5, 8, 12, 28, 36, 48, 64, 94])
def test_default_layer_ids_rule(n):
    ids = default_target_layer_ids(n)
    assert ids == sorted(set(ids))
    assert ids[0] == 1 and ids[-1] == n - 3  # spread over 1..N-3, never the final layer
    assert len(ids) == min(5, n - 3)


def test_from_target_requires_mask_and_rejects_unknown_fields():
    with pytest.raises(ConfigError, match="mask_token_id"):
        DSparkConfig.from_target(qwen3_8b_like())
    with pytest.raises(ConfigError, match="markov_rnak"):
        DSparkConfig.from_target(qwen3_8b_like(), mask_token_id=1, markov_rnak=4)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(target_layer_ids=[1, 5]), "target_layer_ids"),  # 5 = final layer of 6
        (dict(target_layer_ids=[1, 6]), "target_layer_ids"),  # out of range
        (dict(target_layer_ids=[-1, 3]), "target_layer_ids"),
        (dict(target_layer_ids=[3, 1]), "target_layer_ids"),  # not ascending
        (dict(target_layer_ids=[1, 1]), "target_layer_ids"),  # repeated
        (dict(target_layer_ids=[]), "target_layer_ids"),
        (dict(mask_token_id=96), "mask_token_id"),
        (dict(mask_token_id=-1), "mask_token_id"),
        (dict(markov_rank=0), "confidence_head_with_markov"),  # Markov confidence, no rank
        (
            dict(markov_rank=0, markov_head_type="gated", enable_confidence_head=False),
            "markov_head_type",
        ),
        (dict(markov_rank=0, markov_head_type="rnn", enable_confidence_head=False), "markov_rank"),
        (dict(markov_head_type="lstm"), "markov_head_type"),
        (dict(dspark_draft_topk=97), "dspark_draft_topk"),
        (dict(draft_vocab_size=32, dspark_draft_topk=33), "dspark_draft_topk"),
        (dict(dspark_draft_topk=0), "dspark_draft_topk"),
        (dict(block_size=1), "block_size"),
        (dict(draft_vocab_size=0), "draft_vocab_size"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
    ],
)
def test_invalid_config_names_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        tiny_config(**overrides)


def test_valid_edge_configs():
    # DFlash: no Markov head, no confidence head; a Markov-free confidence head is fine too.
    assert not tiny_config(markov_rank=0, enable_confidence_head=False).has_markov
    assert tiny_config(markov_rank=0, confidence_head_with_markov=False).confidence_input_size == 32
    assert tiny_config().confidence_input_size == 32 + 8
    # draft vocab >= target vocab means the full vocab.
    cfg = tiny_config(draft_vocab_size=96)
    assert cfg.draft_vocab_size is None and not cfg.reduced_vocab and cfg.draft_vocab == 96
    assert tiny_config(draft_vocab_size=40, dspark_draft_topk=40).dspark_draft_topk == 40


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(sample_from_anchor=False),
        dict(draft_vocab_size=40, dspark_draft_topk=7, markov_head_type="rnn"),
        dict(markov_rank=0, enable_confidence_head=False, extra={"note": "dflash"}),
        dict(target_name_or_path="Qwen/Qwen3-8B", confidence_head_with_markov=False),
    ],
)
def test_hf_dict_round_trip(overrides):
    cfg = tiny_config(**overrides)
    d = json.loads(json.dumps(cfg.to_hf_dict()))  # what config.json really holds
    back = DSparkConfig.from_hf_dict(d)
    assert dataclasses.asdict(back) == dataclasses.asdict(cfg)
    assert d["architectures"] == ["Qwen3DSparkModel"]
    assert d["layer_types"] == ["full_attention"] * cfg.num_hidden_layers
    assert "is_causal" not in d
    assert d["draft_vocab_size"] == cfg.draft_vocab
    # vLLM 0.26 sizes fc from dflash_config.target_layer_ids (else from num_hidden_layers).
    assert d["dflash_config"] == {
        "target_layer_ids": list(cfg.target_layer_ids),
        "mask_token_id": cfg.mask_token_id,
    }


@pytest.mark.parametrize("key, bad", [("target_layer_ids", [0]), ("mask_token_id", 5)])
def test_dflash_config_mirror_must_agree(key, bad):
    d = tiny_config().to_hf_dict()
    d["dflash_config"] = {**d["dflash_config"], key: bad}
    with pytest.raises(ConfigError, match=f"dflash_config.{key}"):
        DSparkConfig.from_hf_dict(d)


@pytest.mark.parametrize("sfa", [True, False])
def test_both_layout_keys_written_and_opposite(sfa):
    d = tiny_config(sample_from_anchor=sfa).to_hf_dict()
    assert d["sample_from_anchor"] is sfa
    assert d["dspark_bonus_anchor"] is (not sfa)
    # Either key alone decides the layout; equal keys are rejected, not guessed.
    only_bonus = {k: v for k, v in d.items() if k != "sample_from_anchor"}
    assert DSparkConfig.from_hf_dict(only_bonus).sample_from_anchor is sfa
    only_sfa = {k: v for k, v in d.items() if k != "dspark_bonus_anchor"}
    assert DSparkConfig.from_hf_dict(only_sfa).sample_from_anchor is sfa
    with pytest.raises(ConfigError, match="dspark_bonus_anchor"):
        DSparkConfig.from_hf_dict({**d, "dspark_bonus_anchor": sfa})


def test_a_missing_key_is_filled_with_a_warning_never_silently():
    """Older or foreign exports lack keys the reader then assumes: each such value is said as an
    AssumedConfigKey warning naming the key and the value; a complete config.json reads quietly."""
    d = tiny_config(sample_from_anchor=True, target_layer_ids=[0, 2]).to_hf_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DSparkConfig.from_hf_dict(d)
        # the 0.25 key alone is a mapping, not a guess
        DSparkConfig.from_hf_dict({k: v for k, v in d.items() if k != "sample_from_anchor"})
    no_layout = {
        k: v for k, v in d.items() if k not in ("sample_from_anchor", "dspark_bonus_anchor")
    }
    with pytest.warns(AssumedConfigKey, match=r"assuming sample_from_anchor=True"):
        assert DSparkConfig.from_hf_dict(no_layout).sample_from_anchor is True
    no_depth = {k: v for k, v in d.items() if k != "target_num_hidden_layers"}
    with pytest.warns(AssumedConfigKey, match=r"assuming target_num_hidden_layers=4"):
        assert DSparkConfig.from_hf_dict(no_depth).target_num_hidden_layers == 4


@pytest.mark.parametrize("sfa, n_spec, offset", [(True, 4, 0), (False, 3, 1)])
def test_num_speculative_tokens_by_layout(sfa, n_spec, offset):
    cfg = tiny_config(sample_from_anchor=sfa)  # B = 4
    assert cfg.num_speculative_tokens == n_spec
    assert cfg.draft_slot_offset == offset
    assert cfg.to_hf_dict()["num_speculative_tokens"] == n_spec
    # The training forward emits exactly that many draft slots per anchor.
    model = tiny_model(sample_from_anchor=sfa)
    t = 10
    out = model.forward_train(
        torch.randn(1, t, cfg.fc_input_size),
        torch.randint(0, 90, (1, t)),
        torch.tensor([[2, 5]]),
        torch.ones(1, 2, dtype=torch.bool),
    )
    assert out.hidden.shape == (1, 2, n_spec, cfg.hidden_size)
    label_pos, _ = block_label_positions(torch.tensor([[2, 5]]), torch.ones(1, 2).bool(), n_spec, t)
    assert label_pos[0, 0].tolist() == [3, 4, 5, 6][:n_spec]
