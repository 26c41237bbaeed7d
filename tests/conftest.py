"""Shared tiny-model fixtures: DSpark configs and drafts small enough for CPU unit tests.

`tiny_config(**overrides)` / `tiny_model(...)` are plain functions (importable as
`from tests.conftest import tiny_config`) and are also exposed as the fixtures `make_config` /
`make_model`. Sizes: V=96 target vocab, H=32 draft hidden, 2 target layers of width 16 captured
from a 6-layer target, 2 draft layers, B=4, r=8.
"""

from __future__ import annotations

import pytest
import torch

from common.config import DSparkConfig
from common.model import DSparkDraftModel
from common.vocab import build_vocab_map

TINY = dict(
    vocab_size=96,
    target_hidden_size=16,
    target_num_hidden_layers=6,
    target_layer_ids=[1, 3],
    mask_token_id=95,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=48,
    max_position_embeddings=256,
    block_size=4,
    markov_rank=8,
)


def tiny_config(**overrides) -> DSparkConfig:
    return DSparkConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> DSparkDraftModel:
    """A randomly initialised draft in eval mode. The frozen embedding / lm_head come from a random
    "target"; with `draft_vocab_size` set, d2t/t2d come from random counts (`build_vocab_map`).
    RMSNorm weights are randomised too, so a test cannot pass because a norm is the identity."""
    cfg = tiny_config(**overrides)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = DSparkDraftModel(cfg)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    lm_head = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) / cfg.hidden_size**0.5
    if cfg.reduced_vocab:
        counts = torch.randint(0, 5, (cfg.vocab_size,), generator=gen)
        vm = build_vocab_map(counts, cfg.draft_vocab)
        model.init_from_target(embed, lm_head, vm.d2t, vm.t2d)
    else:
        model.init_from_target(embed, lm_head)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return model.to(dtype).eval()


@pytest.fixture
def make_config():
    return tiny_config


@pytest.fixture
def make_model():
    return tiny_model


@pytest.fixture
def torch_single_thread():
    """Run a test on one intra-op thread: tiny tensors gain nothing from threads, and on a shared
    2-core machine thread hand-offs dominate (tens of times slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
