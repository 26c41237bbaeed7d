"""Verification of a drafted block against the target: greedy and lossless rejection sampling.

Conventions:
- `target_logits[:, j]` ([R, N+1, V]) is the target's next-token distribution after the anchor and
  drafts 0..j-1; row N is the bonus distribution after the whole block.
- `positions` [R] is P_0, the position of draft slot 0; every draw producing the token at
  position P is keyed by P - 1 (as drafting is). Accept uniforms use Stream.ACCEPT, residual and
  bonus samples Stream.TARGET, so they are independent of the draft's Stream.DRAFT noise. A
  request verifying nothing (verify_len 0) therefore samples exactly as plain decoding would.
- `verify_len` [R] (adaptive verification) verifies only the first L_r drafts; slots >= L_r are
  neither accepted nor rejected, and when all L_r are accepted the bonus comes from row L_r.
- Temperature <= 0 makes p_t (and a greedy draft's p_d) a point mass, so rejection sampling then
  reduces exactly to greedy verification.

Rejection sampling (Leviathan et al.; Chen et al.): accept x_k with probability
min(1, p_t(x_k) / p_d(x_k)); at the first rejection draw from norm(max(0, p_t - p_d)); if every
verified draft is accepted draw the bonus from p_t. p_d must be the distribution x_k was actually
sampled from (DraftProbs from the Markov walk), in target vocab space.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.sampling.draft_probs import DraftProbs
from common.sampling.gumbel import (
    Stream,
    categorical_from_probs,
    gumbel_sample,
    keyed_uniform,
    sampled_probs,
)

PAD_ID = -1


@dataclass
class VerifyOutput:
    """Per-request verification result.

    Attributes:
        num_accepted: [R] int64 accepted drafts n_r.
        output_ids: [R, N+1] int64: n_r accepted drafts, the correction/bonus token, PAD_ID.
        accepted: [R, N] bool, slot accepted (False also for unverified slots).
        verified: [R, N] bool, slot was put to the accept test (its prefix was accepted and
            k < verify_len); per-position acceptance = accepted.sum(0) / verified.sum(0).
    """

    num_accepted: torch.Tensor
    output_ids: torch.Tensor
    accepted: torch.Tensor
    verified: torch.Tensor

    @property
    def num_output(self) -> torch.Tensor:
        """[R] tokens emitted this step (accepted + 1)."""
        return self.num_accepted + 1


def _verify_len(verify_len: torch.Tensor | None, R: int, N: int, device) -> torch.Tensor:
    if verify_len is None:
        return torch.full((R,), N, dtype=torch.long, device=device)
    return verify_len.long().clamp(0, N)


def _assemble(draft_ids, accepted, verified, final_tok) -> VerifyOutput:
    R, N = draft_ids.shape
    n = accepted.sum(1)  # accepted is a prefix mask
    out = torch.full((R, N + 1), PAD_ID, dtype=torch.long, device=draft_ids.device)
    out[:, :N] = torch.where(accepted, draft_ids, PAD_ID)
    out.scatter_(1, n.unsqueeze(1), final_tok.unsqueeze(1))
    return VerifyOutput(n, out, accepted, verified)


def greedy_verify(
    draft_ids: torch.Tensor,
    target: torch.Tensor,
    verify_len: torch.Tensor | None = None,
) -> VerifyOutput:
    """Accept while draft == target argmax; then emit the target argmax at the first mismatch (or
    after the last verified draft).

    Args:
        draft_ids: [R, N] int64 target ids.
        target: [R, N+1, V] logits, or [R, N+1] int64 target argmax ids.
        verify_len: [R] drafts to verify per request (default N).
    """
    R, N = draft_ids.shape
    t_ids = target if not target.is_floating_point() else target.argmax(-1)  # [R, N+1]
    L = _verify_len(verify_len, R, N, draft_ids.device)
    slot = torch.arange(N, device=draft_ids.device)
    in_len = slot.unsqueeze(0) < L.unsqueeze(1)  # [R, N]
    accepted = torch.cumprod((draft_ids == t_ids[:, :N]) & in_len, dim=1).bool()
    verified = in_len & torch.cat([accepted.new_ones(R, 1), accepted[:, :-1]], dim=1)
    final = t_ids.gather(1, accepted.sum(1, keepdim=True)).squeeze(1)
    return _assemble(draft_ids, accepted, verified, final)


def _residual_probs(p_t: torch.Tensor, p_d: torch.Tensor) -> torch.Tensor:
    """Unnormalised residual max(0, p_t - p_d); [R, V]. Falls back to p_t on an all-zero row
    (only reachable through rounding: p_t == p_d makes a rejection impossible)."""
    res = (p_t - p_d).clamp_(min=0.0)
    return torch.where(res.sum(-1, keepdim=True) > 0, res, p_t)


def rejection_verify(
    draft_ids: torch.Tensor,
    draft_probs: DraftProbs | torch.Tensor | None,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    verify_len: torch.Tensor | None = None,
    fp64: bool = False,
) -> VerifyOutput:
    """Lossless speculative verification with per-request temperature and keyed randomness.

    Args:
        draft_ids: [R, N] int64 drafted target ids.
        draft_probs: the distributions the drafts were sampled from: DraftProbs, a dense
            [R, N, V] target-space tensor, or None for point-mass (greedy) drafts.
        target_logits: [R, N+1, V].
        temperature: [R]; <= 0 is greedy.
        seeds: [R] int64.
        positions: [R] int64 position P_0 of draft slot 0.
        verify_len: [R] drafts to verify per request (default N).
        fp64: float64 noise for the correction and bonus draws (vLLM's `use_fp64_gumbel`); the
            accept uniforms stay on their own stream.
    """
    R, N = draft_ids.shape
    V = target_logits.shape[-1]
    device = draft_ids.device
    if draft_probs is None:
        one_hot = torch.zeros(R, N, V, device=device).scatter_(2, draft_ids.unsqueeze(-1), 1.0)
        draft_probs = DraftProbs.from_target(one_hot, draft_ids)
    elif not isinstance(draft_probs, DraftProbs):
        draft_probs = DraftProbs.from_target(draft_probs, draft_ids)
    L = _verify_len(verify_len, R, N, device)
    col0 = torch.zeros(1, dtype=torch.long, device=device)

    alive = torch.ones(R, dtype=torch.bool, device=device)  # every earlier verified slot accepted
    rejected = torch.zeros_like(alive)
    final = torch.full((R,), PAD_ID, dtype=torch.long, device=device)
    accepted, verified = [], []
    for k in range(N):
        active = alive & (k < L)
        key_pos = positions + (k - 1)
        p_t = sampled_probs(target_logits[:, k], temperature)  # [R, V]
        x = draft_ids[:, k]
        pt_x = p_t.gather(1, x.unsqueeze(1)).squeeze(1)
        pd_x = draft_probs.token_probs[:, k]
        u = keyed_uniform(seeds, key_pos, col0, Stream.ACCEPT)[:, 0]
        # P(u * p_d < p_t) = min(1, p_t / p_d) for u ~ U(0, 1); no division by a tiny p_d.
        acc = active & (u * pd_x < pt_x)
        rej = active & ~acc
        residual = _residual_probs(p_t, draft_probs.row(k))
        corr = categorical_from_probs(residual, seeds, key_pos, stream=Stream.TARGET, fp64=fp64)
        final = torch.where(rej, corr, final)
        rejected |= rej
        accepted.append(acc)
        verified.append(active)
        alive = acc
    accepted_t = torch.stack(accepted, dim=1)  # [R, N]
    n = accepted_t.sum(1)
    # Bonus for requests whose verified prefix was fully accepted: p_t at row n (= L_r).
    bonus_logits = target_logits[torch.arange(R, device=device), n]  # [R, V]
    bonus = gumbel_sample(
        bonus_logits, temperature, seeds, positions + n - 1, stream=Stream.TARGET, fp64=fp64
    )
    final = torch.where(rejected, final, bonus)
    return _assemble(draft_ids, accepted_t, torch.stack(verified, dim=1), final)
