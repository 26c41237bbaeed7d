"""`init_layers_from_target=[IDS]`: the draft's decoder layers start as copies of target layers
(each parameter compared with the target's own), bad ids are refused before training, and a run
with it trains and says what it copied."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from common.config import DSparkConfig
from common.model import DSparkDraftModel
from common.target import decoder_layers
from tests.integration.test_distill import fast
from train.distill import main
from train.errors import SetupError
from train.init.layer_init import copy_target_layers, resolve_layer_ids

SHAPE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)


def target_and_draft(family: str, layers: int = 2):
    torch.manual_seed(0)
    if family == "qwen3":
        target = Qwen3ForCausalLM(Qwen3Config(**SHAPE))
    else:
        target = LlamaForCausalLM(LlamaConfig(**SHAPE))
    cfg = DSparkConfig.from_target(
        target.config.to_dict(), mask_token_id=3, block_size=4, num_hidden_layers=layers
    )
    return target, DSparkDraftModel(cfg)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_each_draft_layer_is_a_copy_of_its_target_layer(family):
    target, draft = target_and_draft(family)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    report = copy_target_layers(draft, target, [-1, 1])
    assert report["target_layers"] == [3, 1]
    source = decoder_layers(target)
    for layer, i in zip(draft.layers, (3, 1), strict=True):
        theirs = dict(source[i].named_parameters())
        for name, p in layer.named_parameters():
            if name in theirs:
                assert torch.equal(p, theirs[name]), (i, name)
    qk = ["self_attn.k_norm.weight", "self_attn.q_norm.weight"]
    # A Llama layer has no q/k norms: the draft's keep their fresh init, and say so.
    assert report["kept_fresh"] == ([] if family == "qwen3" else qk)
    assert (
        "self_attn.q_proj.weight" in report["copied"] and "mlp.down_proj.weight" in report["copied"]
    )
    for name, t in draft.state_dict().items():  # nothing outside the layers moved
        if not name.startswith("layers."):
            assert torch.equal(t, before[name]), name


def test_bad_layer_ids_are_refused():
    assert resolve_layer_ids([-3, -2, -1], 30, 3) == [27, 28, 29]
    with pytest.raises(SetupError, match="one id per draft layer"):
        resolve_layer_ids([1, 2], 30, 3)
    with pytest.raises(SetupError, match="30 is not a layer of the target"):
        resolve_layer_ids([28, 29, 30], 30, 3)
    with pytest.raises(SetupError, match="-31 is not a layer"):
        resolve_layer_ids([-31], 30, 1)


def test_a_run_starts_from_target_layers(target, tmp_path, capsys):
    assert main(fast(target, tmp_path / "run", "init_layers_from_target=[-1]")) == 0
    assert "draft layers from target layers [" in capsys.readouterr().out


def test_init_from_and_layer_copy_together_are_refused(target, tmp_path, capsys):
    args = fast(target, tmp_path / "run", "init_layers_from_target=[-1]", f"init_from={tmp_path}")
    assert main(args) == 2
    assert "init_from and init_layers_from_target" in capsys.readouterr().err
