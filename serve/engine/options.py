"""`EngineOptions`: everything needed to build an `Engine` (the interface `serve.launch` uses).

Only cheap, local checks happen here (`__post_init__`); checks that need the models (vocab,
layer ids, tokenizer) live in `serve.engine.loader`, next to the code that loads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
DRAFT_SAMPLING = ("greedy", "probabilistic")


class OptionsError(ValueError):
    """Bad engine options; the message names the option and the fix."""


@dataclass
class EngineOptions:
    """Engine configuration.

    target: HF model folder of the target (verifier) model.
    checkpoint: DSpark draft folder; None = target-only decoding (baseline).
    num_speculative_tokens: drafts per round, N; default = the checkpoint's
        (`block_size` anchor-first, `block_size - 1` for 1+N); must be 1..that.
    draft_sampling: "greedy" (drafts are argmax) or "probabilistic" (Gumbel sampling at the request
        temperature, verified by rejection sampling).
    adaptive_verification: verify only the confidence-scheduled prefix of each draft (needs a
        confidence head); `sps_table` is the profiled steps-per-second table it maximises against.
    max_num_seqs: running requests per batch; max_model_len: prompt + output tokens per request.
    seed: default per-request seed base (a request's own `seed` wins).
    """

    target: str
    checkpoint: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    num_speculative_tokens: int | None = None
    draft_sampling: str = "probabilistic"
    adaptive_verification: bool = False
    sps_table: str | None = None
    max_num_seqs: int = 8
    max_model_len: int = 2048
    seed: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise OptionsError(f"dtype={self.dtype!r}: choose one of {sorted(DTYPES)}.")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise OptionsError(
                f"draft_sampling={self.draft_sampling!r}: choose one of {DRAFT_SAMPLING}."
            )
        if self.max_num_seqs < 1:
            raise OptionsError(f"max_num_seqs={self.max_num_seqs}: must be >= 1.")
        if self.max_model_len < 2:
            raise OptionsError(f"max_model_len={self.max_model_len}: must be >= 2.")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 1:
            raise OptionsError(
                f"num_speculative_tokens={self.num_speculative_tokens}: must be >= 1 or None "
                "(the checkpoint's default)."
            )
        if self.checkpoint is None and self.adaptive_verification:
            raise OptionsError(
                "adaptive_verification=True needs a draft checkpoint (it schedules drafts)."
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def speculative(self) -> bool:
        return self.checkpoint is not None
