"""vLLM's `Qwen3DSparkForCausalLM` loads every one of its parameters from our safetensors, and its
DSpark head functions agree with ours.

vLLM's `load_weights` never reports a missing tensor (a missing d2t stays zero, Markov/confidence
weights keep their init), so each parameter is poisoned (NaN, or a sentinel for the int64 d2t)
between module creation and loading; afterwards nothing may still be poisoned except
`harness.UNLOADED_BY_DESIGN`, and every parameter must equal our tensor re-laid out as vLLM stacks
it (q/k/v -> qkv_proj, gate/up -> gate_up_proj, rows beyond the vocab padded with zeros).

The head functions are vLLM's own (`compute_draft_logits`, `markov_embed`, `markov_bias`,
`compute_confidence`, `map_draft_to_target`, plus `combine_hidden_states` = fc) after the loader's
post-processing, compared with `DSparkDraftModel` in float32 on random inputs: atol = rtol = 1e-5
(both sides are the same float32 GEMMs; differences come from kernel summation order only).
"""

from __future__ import annotations

import pytest
import torch

from common.config import MARKOV_HEAD_TYPES, VLLM_MARKOV_HEAD_TYPES
from tests.tiny import checkpoint_tensors, write_draft
from tests.vllm import harness as H

pytestmark = pytest.mark.vllm

ATOL = RTOL = 1e-5
VARIANTS = {
    # name: write_draft kwargs
    "reduced-vocab": dict(draft_vocab_size=200),
    "full-vocab": dict(draft_vocab_size=None),
    "bf16-export": dict(draft_vocab_size=200, dtype=torch.bfloat16),
    "confidence-without-markov": dict(draft_vocab_size=200, confidence_head_with_markov=False),
    "no-confidence-head": dict(
        draft_vocab_size=200, enable_confidence_head=False, confidence_head_with_markov=False
    ),
    "bonus-layout": dict(draft_vocab_size=200, sample_from_anchor=False),
}


@pytest.fixture(scope="module")
def loaded(random_target, vllm_workdir):
    """variant -> (checkpoint dir, our model, vLLM LoadedDraft); built lazily, once each."""
    cache = {}

    def get(name):
        if name not in cache:
            path, ours = write_draft(random_target, vllm_workdir / f"w_{name}", **VARIANTS[name])
            n = ours.config.num_speculative_tokens
            vc = H.engine_config(
                random_target, {"method": "dspark", "model": str(path), "num_speculative_tokens": n}
            )
            cache[name] = (path, ours.eval().to(H.DEVICE), H.load_draft(vc))
        return cache[name]

    return get


def _padded(expected: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """vLLM pads vocab-sized parameters (lm_head, markov_w2, embed) to a multiple of 64 rows and
    zero-fills the padding."""
    if expected.shape == got.shape:
        return expected
    assert expected.shape[1:] == got.shape[1:] and expected.shape[0] < got.shape[0]
    out = got.new_zeros(got.shape)
    out[: expected.shape[0]] = expected
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_vllm_parameter_filled_from_our_file(loaded, variant):
    path, ours, draft = loaded(variant)
    assert set(draft.unfilled) == H.UNLOADED_BY_DESIGN, "parameters vLLM left unloaded"
    expected = H.expected_vllm_params(checkpoint_tensors(path))
    got = draft.loaded
    assert set(got) - H.UNLOADED_BY_DESIGN == set(expected), (
        f"vLLM-only: {sorted(set(got) - set(expected) - H.UNLOADED_BY_DESIGN)}, "
        f"ours-only: {sorted(set(expected) - set(got))}"
    )
    for name, want in expected.items():
        have = got[name]
        want = _padded(want.to(have.dtype), have)
        assert torch.equal(have, want), f"{name}: vLLM's value differs from our file"
    cfg = ours.config
    # The parameters that vLLM would silently leave at their init are all there.
    assert ("draft_id_to_target_id" in got) == cfg.reduced_vocab
    assert "model.markov_head.markov_w1.weight" in got
    assert "model.markov_head.markov_w2.weight" in got
    has_conf = "model.confidence_head.proj.weight" in got
    assert has_conf == cfg.enable_confidence_head
    if has_conf:
        assert got["model.confidence_head.proj.weight"].dtype == torch.float32
        assert got["model.confidence_head.proj.weight"].shape == (1, cfg.confidence_input_size)


def test_checkpoint_without_embedding_shares_the_targets(random_target, vllm_workdir):
    """include_embed=False: vLLM's own embed_tokens stays unloaded here, because its
    `load_dspark_model` then aliases the target's embedding (`maybe_share_target_embed`)."""
    path, ours = write_draft(random_target, vllm_workdir / "w_noembed", include_embed=False)
    n = ours.config.num_speculative_tokens
    vc = H.engine_config(
        random_target, {"method": "dspark", "model": str(path), "num_speculative_tokens": n}
    )
    draft = H.load_draft(vc)
    assert set(draft.unfilled) == H.UNLOADED_BY_DESIGN | {"model.embed_tokens.weight"}
    assert not getattr(draft.model, "has_own_embed_tokens", False)


@pytest.mark.parametrize("variant", ["reduced-vocab", "full-vocab", "confidence-without-markov"])
@torch.no_grad()
def test_head_functions_match_ours(loaded, variant):
    _, ours, draft = loaded(variant)
    vm, cfg = draft.model, ours.config
    g = torch.Generator().manual_seed(0)
    m = 37
    hidden = torch.randn(m, cfg.hidden_size, generator=g).to(H.DEVICE)
    prev = torch.randint(0, cfg.vocab_size, (m,), generator=g).to(H.DEVICE)  # target ids
    aux = torch.randn(m, cfg.fc_input_size, generator=g).to(H.DEVICE)

    def close(a, b, what):
        H.assert_close(a, b, what, ATOL, RTOL)

    close(
        vm.compute_draft_logits(hidden), ours.compute_draft_logits(hidden), "compute_draft_logits"
    )
    e_v, e_o = vm.markov_embed(prev), ours.markov_embed(prev)
    close(e_v, e_o, "markov_embed")
    close(vm.markov_bias(e_v), ours.markov_bias(e_o), "markov_bias")
    if cfg.enable_confidence_head:
        close(
            vm.compute_confidence(hidden, e_v), ours.compute_confidence(hidden, e_o), "confidence"
        )
    draft_ids = torch.arange(cfg.draft_vocab, device=H.DEVICE)
    assert torch.equal(vm.map_draft_to_target(draft_ids), ours.map_draft_to_target(draft_ids))
    close(vm.combine_hidden_states(aux), ours.fc(aux), "fc (combine_hidden_states)")
    # Same logits shape and order: draft-id space, [M, Vd], not padded.
    assert vm.compute_draft_logits(hidden).shape == (m, cfg.draft_vocab)


def test_negative_control_dropped_tensors_are_caught(random_target, vllm_workdir):
    """The poison check is what catches mistakes: vLLM's loader itself accepts a checkpoint with
    Markov/confidence tensors missing and says nothing."""
    from safetensors.torch import save_file

    from common.checkpoint import WEIGHTS_NAME

    path, ours = write_draft(random_target, vllm_workdir / "w_dropped")
    tensors = checkpoint_tensors(path)
    dropped = ["markov_head.markov_w1.weight", "confidence_head.proj.bias"]
    for key in dropped:
        del tensors[key]
    save_file(tensors, str(path / WEIGHTS_NAME))
    n = ours.config.num_speculative_tokens
    vc = H.engine_config(
        random_target, {"method": "dspark", "model": str(path), "num_speculative_tokens": n}
    )
    draft = H.load_draft(vc)  # no error from vLLM
    assert set(draft.unfilled) == H.UNLOADED_BY_DESIGN | {"model." + k for k in dropped}


@pytest.mark.parametrize(
    "variant",
    [
        ("full-vocab", None, True),
        ("reduced-vocab", 200, True),
        ("own-embedding", 200, False),
    ],
    ids=lambda v: v[0],
)
@torch.no_grad()
def test_load_dspark_model_shares_target_weights(random_target, vllm_workdir, variant):
    """The GPU runner's own `load_dspark_model`, run on CPU with vLLM's target model: it keeps the
    draft's embedding / lm_head only where they differ from the target's. Ours are the target's
    (frozen) except the reduced-vocab lm_head rows, so it shares the embedding, shares lm_head for a
    full vocab, and keeps our lm_head for a reduced one; a draft with its own embedding keeps it."""
    name, vocab, from_target = variant
    path, ours = write_draft(
        random_target,
        vllm_workdir / f"ldm_{name}",
        draft_vocab_size=vocab,
        embed_from_target=from_target,
    )
    n = ours.config.num_speculative_tokens
    vc = H.engine_config(
        random_target, {"method": "dspark", "model": str(path), "num_speculative_tokens": n}
    )
    target, draft = H.load_target_and_draft(vc)
    assert (draft.model.embed_tokens is target.model.embed_tokens) == from_target
    assert (draft.lm_head is target.lm_head) == (from_target and vocab is None)
    ours = ours.to(H.DEVICE)
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(9, ours.config.hidden_size, generator=g).to(H.DEVICE)
    ids = torch.randint(0, ours.config.vocab_size, (9,), generator=g).to(H.DEVICE)
    H.assert_close(
        draft.compute_draft_logits(hidden), ours.compute_draft_logits(hidden), "logits", ATOL, RTOL
    )
    H.assert_close(draft.model.embed_input_ids(ids), ours.embed_tokens(ids), "embedding", 0.0, 0.0)


@pytest.mark.parametrize("kind", [t for t in MARKOV_HEAD_TYPES if t not in VLLM_MARKOV_HEAD_TYPES])
def test_non_vanilla_markov_head_is_refused_by_stock_vllm(random_target, vllm_workdir, kind):
    """Stock vLLM builds only the vanilla head: a gated/rnn checkpoint fails loudly at load (its
    extra head weights have no vLLM parameter); `serve.check --vllm` says so before launch."""
    from serve.check import main as serve_check

    path, ours = write_draft(random_target, vllm_workdir / f"w_{kind}", markov_head_type=kind)
    assert serve_check([str(path), "--vllm"]) == 1
    n = ours.config.num_speculative_tokens
    vc = H.engine_config(
        random_target, {"method": "dspark", "model": str(path), "num_speculative_tokens": n}
    )
    extra = "markov_gate" if kind == "gated" else "markov_rnn"
    with pytest.raises(ValueError, match=f"no module or parameter named 'markov_head.{extra}'"):
        H.load_draft(vc)
