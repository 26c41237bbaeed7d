"""TargetCapture feeds the draft what vLLM does: the pre-norm output of decoder layer i, which is
HF `output_hidden_states[i+1]`, concatenated in ascending id order."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3ForCausalLM

from common.config import DSparkConfig
from common.target import TargetCapture, target_head_weights
from tests.tiny import tiny_target_config

pytestmark = pytest.mark.usefixtures("torch_single_thread")

N_LAYERS, HIDDEN = 7, 16


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = tiny_target_config(
        64, HIDDEN, N_LAYERS, 2, 1, max_position_embeddings=64, tie_word_embeddings=True
    )
    return Qwen3ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("layer_ids", [[0], [1, 4], [0, 2, 3, 5]])
def test_aux_equals_hf_hidden_states(target, ids, layer_ids):
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    ref = out.hidden_states  # N_LAYERS + 1 entries; the last one is post-norm
    cap = TargetCapture(target, layer_ids)(ids)
    assert cap.aux.shape == (2, 9, HIDDEN * len(layer_ids))
    for k, i in enumerate(layer_ids):
        torch.testing.assert_close(cap.aux[..., k * HIDDEN : (k + 1) * HIDDEN], ref[i + 1])
    # Not an off-by-one: layer i's input (hidden_states[i]) differs from what was captured.
    assert not torch.allclose(cap.aux[..., :HIDDEN], ref[layer_ids[0]])
    # The final state is post-norm: exactly what the teacher lm_head reads.
    torch.testing.assert_close(cap.final, ref[-1])
    torch.testing.assert_close(target.lm_head(cap.final), out.logits)


def test_default_ids_from_config_feed_the_draft(target, ids):
    cfg = DSparkConfig.from_target(target.config, mask_token_id=63, num_hidden_layers=1)
    assert cfg.target_layer_ids == [1, 2, 3, 4]  # spread over 1..N-3 for N=7
    cap = TargetCapture(target, cfg.target_layer_ids)(ids)
    assert cap.aux.shape[-1] == cfg.fc_input_size
    embed, lm_head = target_head_weights(target)
    assert embed.shape == lm_head.shape == (cfg.vocab_size, cfg.hidden_size)


@pytest.mark.parametrize("bad", [[N_LAYERS - 1], [1, N_LAYERS - 1], [N_LAYERS], [-1]])
def test_final_or_missing_layer_raises(target, bad):
    with pytest.raises(ValueError, match=r"draft\.target_layer_ids"):
        TargetCapture(target, bad)


def _llama(cfg):  # SmolLM2's architecture, the same sizes
    from transformers import LlamaConfig, LlamaForCausalLM

    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    keys += ("num_attention_heads", "num_key_value_heads", "max_position_embeddings")
    return LlamaForCausalLM(LlamaConfig(**{k: getattr(cfg, k) for k in keys}))


@pytest.mark.parametrize("arch", [Qwen3ForCausalLM, _llama], ids=["qwen3", "llama"])
def test_capture_through_compiled_layers_equals_eager(ids, arch):
    """trainer.compile_target compiles each decoder layer before TargetCapture hooks them: the
    compiled call must still run the hooks and give the eager states, packed rows included."""
    from train.loop.target import apply_speed_settings

    torch.manual_seed(0)
    cfg = tiny_target_config(64, HIDDEN, 4, 2, 1, max_position_embeddings=64)
    model = arch(cfg).eval()
    packed = torch.cat([torch.arange(5), torch.arange(4)]).repeat(2, 1)  # two rows in one
    ref = TargetCapture(model, [1, 2])(ids)
    ref_packed = TargetCapture(model, [1, 2])(ids, position_ids=packed)
    draft = type("Draft", (), {"layers": []})()
    apply_speed_settings({"compile_target": True}, draft, model, torch.device("cuda"))
    try:
        got = TargetCapture(model, [1, 2])(ids)
        got_packed = TargetCapture(model, [1, 2])(ids, position_ids=packed)
    finally:
        apply_speed_settings({}, draft, model, torch.device("cuda"))
    for a, b in ((got, ref), (got_packed, ref_packed)):
        torch.testing.assert_close(a.aux, b.aux, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.final, b.final, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref_packed.final, ref.final)  # the positions reach the states


def test_packed_rows_through_flex_and_compiled_layers_equal_sdpa():
    """What a SmolLM2 run with trainer.target_attention=flex and trainer.compile_target=true feeds
    the draft: packed documents under a flex BlockMask through compiled Llama layers give the
    states of the dense-mask sdpa path."""
    from train.loop.blocks import capture_batch
    from train.loop.target import apply_speed_settings

    torch.manual_seed(0)
    model = _llama(tiny_target_config(64, HIDDEN, 4, 2, 1, max_position_embeddings=64)).eval()
    doc = torch.tensor([[0] * 5 + [1] * 4, [0] * 3 + [1] * 6])
    pos = torch.cat([torch.arange(5), torch.arange(4), torch.arange(3), torch.arange(6)]).view(2, 9)
    batch = {"input_ids": torch.randint(0, 64, (2, 9)), "doc_ids": doc, "position_ids": pos}
    ref = capture_batch(TargetCapture(model, [1, 2]), batch)
    draft = type("Draft", (), {"layers": []})()
    settings = {"target_attention": "flex", "compile_target": True}
    apply_speed_settings(settings, draft, model, torch.device("cuda"))
    try:
        got = capture_batch(TargetCapture(model, [1, 2]), batch)
    finally:
        apply_speed_settings({}, draft, model, torch.device("cuda"))
    torch.testing.assert_close(got.aux, ref.aux, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.final, ref.final, rtol=1e-4, atol=1e-5)
