"""The tiny models every test suite builds from (CPU suite, model card, vLLM suite).

`tiny_config(**overrides)` is the one tiny `DSparkConfig` (V=96 target vocab, H=32 draft hidden,
2 target layers of width 16 captured from a 6-layer target, 2 draft layers, B=4, r=8);
`tiny_model(...)` a draft of it with a random "target" embedding / lm_head and vocab map.
`tiny_target_config` is the tiny Qwen3 target config the suites start from (head_dim = hidden /
heads, MLP 2x hidden, untied embeddings unless asked). `randomise_` gives every parameter
distinct random values (the vLLM suite's poison-and-fill tests need that), and
`random_vocab_map` is the reduced-vocab map both draft builders use. The vLLM suite sizes its
drafts from its own tiny target (`tests/vllm/ckpts.py`: head_dim 32 for vLLM's CPU attention)
with these same helpers.
"""

from __future__ import annotations

import torch

from common.config import DSparkConfig
from common.model import DSparkDraftModel
from common.vocab import VocabMap, build_vocab_map

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
        vm = random_vocab_map(cfg, gen)
        model.init_from_target(embed, lm_head, vm.d2t, vm.t2d)
    else:
        model.init_from_target(embed, lm_head)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return model.to(dtype).eval()


def random_vocab_map(cfg: DSparkConfig, gen: torch.Generator, max_count: int = 5) -> VocabMap:
    """The reduced-vocab map of random token counts (`cfg.draft_vocab` ids)."""
    counts = torch.randint(0, max_count, (cfg.vocab_size,), generator=gen)
    return build_vocab_map(counts, cfg.draft_vocab)


@torch.no_grad()
def randomise_(model: DSparkDraftModel, seed: int) -> None:
    """Every parameter random and distinct (norms near 1), so a swapped or dropped tensor cannot
    hide behind an init value."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * noise)  # distinct per norm: a swapped norm changes outputs
        else:
            p.copy_(noise / max(p.shape[-1], 1) ** 0.5)


def tiny_target_config(
    vocab_size: int,
    hidden_size: int = 32,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    **overrides,
):
    """A tiny Qwen3 target config (`transformers.Qwen3Config`); overrides pass through."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=hidden_size // num_attention_heads,
        **{"tie_word_embeddings": False, **overrides},
    )
