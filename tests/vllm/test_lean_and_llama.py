"""Lean exports and a Llama target, through vLLM's own loaders.

Lean export (what `train.publish.export` writes): no embed_tokens, and no lm_head with the full
vocab.
Poisoned both ways: vLLM's `load_weights` must leave exactly those parameters unloaded (nothing
else), and the GPU runner's `load_dspark_model` must then replace them with the target's own
modules, so that no poisoned value survives and the draft's logits and embeddings are ours.

Llama target: vLLM parses the speculative config against it, loads its own Llama for the target,
shares its embedding / lm_head with a lean draft, and loads every draft parameter from a
self-contained file.
"""

from __future__ import annotations

import pytest
import torch

from tests.tiny import checkpoint_tensors, write_draft, write_random_target
from tests.vllm import harness as H

pytestmark = pytest.mark.vllm

ATOL = RTOL = 1e-5


@pytest.fixture(scope="module")
def llama_target(vllm_workdir):
    return write_random_target(vllm_workdir / "llama_target", family="llama")


def spec(path, ours) -> dict:
    n = ours.config.num_speculative_tokens
    return {"method": "dspark", "model": str(path), "num_speculative_tokens": n}


def lean_draft(target, out, vocab):
    return write_draft(
        target,
        out,
        draft_vocab_size=vocab,
        embed_from_target=True,
        include_embed=False,
        include_lm_head=False,
    )


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("vocab", [None, 200], ids=["full-vocab", "reduced-vocab"])
def test_lean_export_is_completed_from_the_target(
    random_target, llama_target, vllm_workdir, family, vocab
):
    target_dir = random_target if family == "qwen3" else llama_target
    path, ours = lean_draft(target_dir, vllm_workdir / f"lean_{family}_{vocab}", vocab)
    keys = set(checkpoint_tensors(path))
    assert "embed_tokens.weight" not in keys
    assert ("lm_head.weight" in keys) == (vocab is not None)
    # Way 1: the file alone fills every parameter except the shared tables.
    shared = {"model.embed_tokens.weight"} | ({"lm_head.weight"} if vocab is None else set())
    draft_only = H.load_draft(H.engine_config(target_dir, spec(path, ours)))
    assert set(draft_only.unfilled) == H.UNLOADED_BY_DESIGN | shared

    # Way 2: load_dspark_model replaces exactly those with the target's modules, and what is
    # served is our draft's embedding and logits.
    # (A fresh VllmConfig: vLLM registers layer names once per config.)
    target, draft = H.load_target_and_draft(H.engine_config(target_dir, spec(path, ours)))
    assert draft.model.embed_tokens is target.model.embed_tokens
    assert (draft.lm_head is target.lm_head) == (vocab is None)
    ref = ours.float().eval().to(H.DEVICE)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, ours.config.vocab_size, (7,), generator=g).to(H.DEVICE)
    with torch.no_grad():
        H.assert_close(
            draft.model.embed_input_ids(ids), ref.embed_tokens(ids), "embedding", 0.0, 0.0
        )
        hidden = torch.randn(7, ours.config.hidden_size, generator=g).to(H.DEVICE)
        H.assert_close(
            draft.compute_draft_logits(hidden),
            ref.compute_draft_logits(hidden),
            "logits",
            ATOL,
            RTOL,
        )


def test_llama_target_config_and_poison(llama_target, vllm_workdir):
    """vLLM reads our draft config against a Llama target (layer ids, hidden sizes, layout), and
    a self-contained file fills every vLLM draft parameter."""
    path, ours = write_draft(llama_target, vllm_workdir / "llama_full", draft_vocab_size=200)
    vc = H.engine_config(llama_target, spec(path, ours))
    assert vc.model_config.hf_config.model_type == "llama"
    d, cfg = H.derived(vc), ours.config
    assert d["aux_layer_ids"] == [i + 1 for i in cfg.target_layer_ids]
    assert d["num_speculative_tokens"] == cfg.num_speculative_tokens
    assert d["block_size"] == cfg.block_size and d["mask_token_id"] == cfg.mask_token_id
    assert d["target_hidden_size"] == cfg.target_hidden_size
    assert d["sample_from_anchor"] == cfg.sample_from_anchor
    draft = H.load_draft(vc)
    assert set(draft.unfilled) == H.UNLOADED_BY_DESIGN
    expected = H.expected_vllm_params(checkpoint_tensors(path))
    for name, want in expected.items():
        have = draft.loaded[name]
        if want.shape != have.shape:  # vocab rows padded to a multiple of 64
            pad = have.new_zeros(have.shape)
            pad[: want.shape[0]] = want.to(have.dtype)
            want = pad
        assert torch.equal(have, want.to(have.dtype)), name
