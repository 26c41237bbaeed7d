"""Tiny DSpark draft models for sampling tests (no target, no downloads).

Only the heads matter to the sampling code (lm_head, Markov head, confidence head, d2t), so the
backbone is one minimal layer and the heads are re-initialised with a larger scale: default
nn.Linear init gives near-uniform draft distributions over a tiny vocab, which would make the
draft look like the target and the losslessness tests weak.
"""

from __future__ import annotations

import torch

from common.config import DSparkConfig
from common.model import DSparkDraftModel


def tiny_config(
    vocab_size: int = 8,
    draft_vocab_size: int | None = None,
    markov_head_type: str = "vanilla",
    markov_rank: int = 4,
    confidence: bool = True,
    sample_from_anchor: bool = True,
    block_size: int = 4,
    hidden_size: int = 16,
    topk: int | None = None,
) -> DSparkConfig:
    return DSparkConfig(
        vocab_size=vocab_size,
        target_hidden_size=8,
        target_num_hidden_layers=4,
        target_layer_ids=[1],
        mask_token_id=vocab_size - 1,
        hidden_size=hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        block_size=block_size,
        markov_rank=markov_rank,
        markov_head_type=markov_head_type,
        enable_confidence_head=confidence,
        confidence_head_with_markov=confidence and markov_rank > 0,
        draft_vocab_size=draft_vocab_size,
        sample_from_anchor=sample_from_anchor,
        dspark_draft_topk=topk,
    )


def tiny_model(seed: int = 0, scale: float = 1.0, **kw) -> DSparkDraftModel:
    """A DSparkDraftModel from `tiny_config(**kw)` with seeded, O(1)-logit head weights and, for
    a reduced vocab, a seeded sorted selection of target ids."""
    cfg = tiny_config(**kw)
    g = torch.Generator().manual_seed(seed)
    model = DSparkDraftModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale / max(p.shape[-1], 1) ** 0.5)
        model.lm_head.weight.mul_(3.0)  # peaky base logits: a draft clearly unlike the target
        if cfg.reduced_vocab:
            sel = torch.randperm(cfg.vocab_size, generator=g)[: cfg.draft_vocab].sort().values
            model.d2t.copy_(sel - torch.arange(cfg.draft_vocab))
            model.t2d.zero_()
            model.t2d[sel] = True
    return model.eval()


def _single_thread():
    """Tiny tensors: one intra-op thread. On a loaded 2-core box an OpenMP pool spinning at its
    barriers made these tests 10-30x slower; restored after the module."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


try:  # a fixture for the test modules; torchrun ranks (tests/dist) may run without pytest
    import pytest

    single_thread = pytest.fixture(autouse=True, scope="module")(_single_thread)
except ImportError:  # pragma: no cover
    single_thread = None
