"""The draft distributions a Markov walk actually sampled from, stored as compactly as verification
allows.

Rejection sampling needs, per drafted slot k, p_d(x_k) (for the accept ratio) and, only at the first
rejected slot of each request, the full p_d row in *target* vocab space (for the residual
max(0, p_t - p_d)). A dense [R, N, V_target] fp32 tensor is 272 MB at R=64, N=7, V=151,936, so the
walk keeps rows in the space it sampled in and scatters one slot at a time on demand:
- full vocab: C = V, `cols` is None (already target space);
- reduced vocab: C = V_draft, `cols` [C] is the draft->target column map (d2t applied);
- top-k: C = k, `cols` [R, N, k] holds the target ids of each slot's candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftProbs:
    """Sampled-from draft distributions.

    Attributes:
        probs: [R, N, C] float32; each row sums to 1 over its C entries (one-hot for greedy rows).
        cols: None (C == vocab_size), [C] or [R, N, C] int64 target column of each entry.
        token_probs: [R, N] float32, p_d of the token drafted at each slot.
        vocab_size: target vocab size V.
    """

    probs: torch.Tensor
    cols: torch.Tensor | None
    token_probs: torch.Tensor
    vocab_size: int

    @property
    def num_slots(self) -> int:
        return self.probs.shape[1]

    def row(self, k: int) -> torch.Tensor:
        """Slot k's distribution in target space; [R, V] float32, zeros outside the support."""
        p = self.probs[:, k]  # [R, C]
        if self.cols is None:
            return p
        cols = self.cols if self.cols.dim() == 1 else self.cols[:, k]
        cols = cols.expand_as(p)
        out = p.new_zeros(p.shape[0], self.vocab_size)
        return out.scatter_(1, cols, p)

    def to_target(self) -> torch.Tensor:
        """All slots in target space; [R, N, V] float32 (the memory-hungry form)."""
        return torch.stack([self.row(k) for k in range(self.num_slots)], dim=1)

    def select_rows(self, rows: torch.Tensor) -> DraftProbs:
        """Rows `rows` [R'] (e.g. a rank's owned requests) as a new DraftProbs."""
        cols = self.cols if self.cols is None or self.cols.dim() == 1 else self.cols[rows]
        return DraftProbs(self.probs[rows], cols, self.token_probs[rows], self.vocab_size)

    @classmethod
    def from_target(cls, probs: torch.Tensor, draft_ids: torch.Tensor) -> DraftProbs:
        """Wrap dense target-space probabilities [R, N, V] for the drafted ids [R, N]."""
        probs = probs.float()
        token = probs.gather(2, draft_ids.unsqueeze(-1)).squeeze(-1)
        return cls(probs, None, token, probs.shape[-1])
