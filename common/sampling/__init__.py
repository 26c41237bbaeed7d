"""Sampling for DSpark drafting and verification, as plain functions over tensors.

Shared by the serving engine, training-time evaluation and tests. One job per module:
- `gumbel`: keyed (seed, stream, position, column) Gumbel-max sampling, reproducible and
  independent of batch composition;
- `markov_walk`: the sequential Markov stage (dense and top-k), drafts + sampled-from
  distributions (`draft_probs.DraftProbs`) + confidences;
- `verify`: greedy and lossless rejection-sampling verification with per-request verify lengths;
- `draft_budget`: vLLM 0.34's adaptive verification (batch draft budget, survival allocation,
  cost tables; the engine's padded cost table and its profiler);
- `adaptive`: the paper's Algorithm 1 verify-length scheduler and the SPS table;
- `acceptance_estimator`: vLLM's online acceptance estimator (drafts without a confidence head);
- `sharded`: tensor-parallel batch-sharded Markov walk over torch.distributed.
"""

from common.sampling.acceptance_estimator import OnlineAcceptanceEstimator
from common.sampling.adaptive import SPSTable, VerifyPlan, plan_verify_lengths
from common.sampling.draft_budget import (
    PaddedCostTable,
    allocate_draft_budget,
    choose_draft_budget,
    plan_budgeted_verify_lengths,
    profile_padded_costs,
)
from common.sampling.draft_probs import DraftProbs
from common.sampling.gumbel import (
    Stream,
    categorical_from_probs,
    gumbel_noise,
    gumbel_sample,
    keyed_uniform,
    sampled_probs,
)
from common.sampling.markov_walk import MarkovWalkOutput, markov_walk
from common.sampling.sharded import (
    ShardedWalkOutput,
    sharded_markov_walk,
    sharding_disabled_reason,
)
from common.sampling.verify import PAD_ID, VerifyOutput, greedy_verify, rejection_verify

__all__ = [
    "PAD_ID",
    "DraftProbs",
    "MarkovWalkOutput",
    "OnlineAcceptanceEstimator",
    "PaddedCostTable",
    "SPSTable",
    "ShardedWalkOutput",
    "Stream",
    "VerifyOutput",
    "VerifyPlan",
    "allocate_draft_budget",
    "categorical_from_probs",
    "choose_draft_budget",
    "greedy_verify",
    "gumbel_noise",
    "gumbel_sample",
    "keyed_uniform",
    "markov_walk",
    "plan_budgeted_verify_lengths",
    "plan_verify_lengths",
    "profile_padded_costs",
    "rejection_verify",
    "sampled_probs",
    "sharded_markov_walk",
    "sharding_disabled_reason",
]
