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
# "vllm": vLLM 0.34's batch draft budget (global argmax of expected tokens / step cost, then the
# budget's slots by survival); "algorithm1": the DSpark paper's greedy admission that stops at the
# first non-improvement. Both in common.sampling; see docs there.
ADAPTIVE_POLICIES = ("vllm", "algorithm1")
# Which confidences pick the vllm policy's budget: "current" (this round's, the engine's default:
# vLLM without its copy lag) or "previous" (vLLM 0.34's: each request's previous round's, ones for
# its first round). The allocation always uses the current ones.
BUDGET_CONFIDENCES = ("current", "previous")


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
    adaptive_verification: verify only a confidence-scheduled prefix of each draft. Confidences
        come from the draft's confidence head, or, without one, from vLLM's online acceptance
        estimator (fitted while serving).
    adaptive_policy: how verify lengths are chosen (ADAPTIVE_POLICIES); default vLLM's.
    adaptive_budget_confidence: vllm policy: the confidences that choose the batch's draft
        budget (BUDGET_CONFIDENCES): "current" = this round's (default); "previous" = vLLM
        0.34's lag, each request's previous spec round's (all ones for its first); the budget's
        slots are allocated by the current confidences either way.
    cost_table: a saved `PaddedCostTable` (JSON) of draft and padded verify step costs; None =
        profile one at start-up on the batches the engine runs.
    sps_table: algorithm1 only: a steps-per-second table by token count (the paper's model)
        used instead of the padded cost table.
    use_fp64_gumbel: float64 Gumbel noise for every draw (vLLM's `--use-fp64-gumbel`).
    tp: ranks sharing the sampling (vLLM's batch-sharded sampling with `-tp N`): the engine
        runs on every rank of an initialised torch.distributed world of this size (e.g. under
        torchrun, gloo or NCCL), models replicated, each rank sampling the requests it owns;
        outputs are bit-identical to tp=1 on every rank. 1 = one process.
    max_num_seqs: running requests per batch; max_model_len: prompt + output tokens per request.
    seed: default per-request seed base (a request's own `seed` wins).
    checkpoint_checked: the checkpoint was already validated against the target (serve.launch
        runs `common.contract.serving_problems` once per launch); the engine then does not
        compare the draft with the target again.
    """

    target: str
    checkpoint: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    num_speculative_tokens: int | None = None
    draft_sampling: str = "probabilistic"
    adaptive_verification: bool = False
    adaptive_policy: str = "vllm"
    adaptive_budget_confidence: str = "current"
    cost_table: str | None = None
    sps_table: str | None = None
    use_fp64_gumbel: bool = False
    tp: int = 1
    max_num_seqs: int = 8
    max_model_len: int = 2048
    seed: int = 0
    checkpoint_checked: bool = False

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise OptionsError(f"dtype={self.dtype!r}: choose one of {sorted(DTYPES)}.")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise OptionsError(
                f"draft_sampling={self.draft_sampling!r}: choose one of {DRAFT_SAMPLING}."
            )
        if self.tp < 1:
            raise OptionsError(f"tp={self.tp}: must be >= 1.")
        if self.max_num_seqs < 1:
            raise OptionsError(f"max_num_seqs={self.max_num_seqs}: must be >= 1.")
        if self.max_model_len < 2:
            raise OptionsError(f"max_model_len={self.max_model_len}: must be >= 2.")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 1:
            raise OptionsError(
                f"num_speculative_tokens={self.num_speculative_tokens}: must be >= 1 or None "
                "(the checkpoint's default)."
            )
        if self.adaptive_policy not in ADAPTIVE_POLICIES:
            raise OptionsError(
                f"adaptive_policy={self.adaptive_policy!r}: choose one of {ADAPTIVE_POLICIES}."
            )
        if self.adaptive_budget_confidence not in BUDGET_CONFIDENCES:
            raise OptionsError(
                f"adaptive_budget_confidence={self.adaptive_budget_confidence!r}: choose one of "
                f"{BUDGET_CONFIDENCES}."
            )
        if self.adaptive_budget_confidence != "current" and self.adaptive_policy != "vllm":
            raise OptionsError(
                f"adaptive_budget_confidence={self.adaptive_budget_confidence!r} sets how vLLM's "
                f"policy picks its draft budget; adaptive_policy={self.adaptive_policy!r} has no "
                "budget: set adaptive_policy='vllm' or adaptive_budget_confidence='current'."
            )
        if self.sps_table is not None and self.adaptive_policy != "algorithm1":
            raise OptionsError(
                f"sps_table={self.sps_table!r} prices Algorithm 1 by token count; with "
                f"adaptive_policy={self.adaptive_policy!r} pass cost_table (or neither: the "
                "engine profiles one), or set adaptive_policy='algorithm1'."
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
