"""`DraftRunner`: the DSpark draft step, batched across requests.

Per running request (slot) it keeps the draft's context K/V, per draft layer
`[S, capacity, nkv, hd]`, built from the target's captured aux hidden states (`context_kv`).
A draft step for R requests, each with anchor x_p at position p = its context length:

1. Parallel stage: ONE backbone pass over the query block for all rows, against their
   (bucketed, padded) context K/V under `inference_block_mask`: Q = N + `draft_slot_offset` slots
   `[x_p, MASK x (Q-1)]` at positions p..p+Q-1, as vLLM builds it (anchor-first: N slots, each
   predicting the next token; 1+N: the anchor then N masks). With N below the trained length the
   block is SHORTER, not the full block sliced: the block attends bidirectionally inside itself,
   so the masks past Q would change every slot's hidden state. Base draft logits
   `U = lm_head(h)` for the N draft slots (slot j+offset predicts x_{p+1+j}).
2. Sequential stage (`Sampler.walk`): the Markov loop over j = 0..N-1, all rows at once:
   logits = U_j + bias(prev), sample (argmax or keyed Gumbel), map draft -> target id, prev =
   that target id (the anchor for j = 0); confidences `compute_confidence(h_j, W1[prev])` when
   adaptive verification wants them.

Shapes depend only on (R, bucketed context length, B), never on per-request data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from common.model import DSparkDraftModel, inference_block_mask
from serve.engine.kv_cache import round_up
from serve.engine.sampler import Sampler, Walk


@dataclass
class Proposal:
    """walk: drafts [R, N] (target ids), their sampled-from distributions and confidences;
    backbone_s / markov_s: wall time of the parallel stage (backbone + base logits) and of the
    sequential Markov loop (bias + sampling per slot)."""

    walk: Walk
    backbone_s: float
    markov_s: float


class DraftRunner:
    def __init__(
        self,
        model: DSparkDraftModel,
        slots: int,
        capacity: int,
        num_speculative_tokens: int,
        ctx_bucket: int = 64,
    ):
        self.model = model.eval()
        cfg = model.config
        self.cfg, self.n = cfg, num_speculative_tokens
        self.capacity, self.ctx_bucket = capacity, ctx_bucket
        p = model.fc.weight
        self.device, self.dtype = p.device, p.dtype
        shape = (slots, capacity, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in model.layers]
        self.v = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in model.layers]
        # Query slots per request: what vLLM's DSpark speculator runs (`num_query_per_req`).
        self.num_query = num_speculative_tokens + cfg.draft_slot_offset
        if self.num_query > cfg.block_size:
            raise ValueError(
                f"num_speculative_tokens={num_speculative_tokens} needs {self.num_query} query "
                f"slots, more than the checkpoint's block_size={cfg.block_size}"
            )
        self._offsets = torch.arange(self.num_query, device=p.device)
        self._sync = p.device.type == "cuda"

    def _clock(self) -> float:
        if self._sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    @torch.no_grad()
    def write_context(self, rows: list[int], aux: torch.Tensor, start: torch.Tensor) -> None:
        """Store context K/V for positions start[r]..start[r]+T-1 of each row.

        aux: [R, T, L*Ht] the target's captured states of those positions. Rows whose valid
        context ends before start+T (padding, rejected drafts) leave stale entries past their
        length; the block mask never reads them and later writes overwrite them.
        """
        r, t = aux.shape[:2]
        start = start.to(self.device)
        pos = start.view(-1, 1) + torch.arange(t, device=self.device)  # [R, T]
        if int(pos.max()) >= self.capacity:
            raise RuntimeError(f"draft context overflow: position {int(pos.max())}")
        kv = self.model.context_kv(aux.to(self.device), pos)
        idx = torch.tensor(rows, device=self.device).view(-1, 1)
        for layer, (k, v) in enumerate(kv):
            self.k[layer][idx, pos] = k
            self.v[layer][idx, pos] = v

    def _context(self, rows: list[int], c: int):
        idx = torch.tensor(rows, device=self.device)
        contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
        out = []
        for k, v in zip(self.k, self.v, strict=True):
            if contiguous:
                sl = slice(rows[0], rows[0] + len(rows))
                out.append((k[sl, :c], v[sl, :c]))
            else:
                out.append((k.index_select(0, idx)[:, :c], v.index_select(0, idx)[:, :c]))
        return out

    @torch.no_grad()
    def propose(
        self,
        rows: list[int],
        anchors: torch.Tensor,  # [R] target ids x_p
        ctx_lens: torch.Tensor,  # [R] p (= valid context length)
        sampler: Sampler,
        temperature: torch.Tensor,  # [R]
        seeds: torch.Tensor,  # [R]
        want_confidence: bool = False,
        on_slot_logits=None,
    ) -> Proposal:
        model, cfg = self.model, self.cfg
        t0 = self._clock()
        anchors, ctx_lens = anchors.to(self.device), ctx_lens.to(self.device)
        c = min(round_up(int(ctx_lens.max()), self.ctx_bucket), self.capacity)
        q = self.num_query
        block_ids = anchors.new_full((len(rows), q), cfg.mask_token_id)  # [R, Q]
        block_ids[:, 0] = anchors
        block_pos = ctx_lens.view(-1, 1) + self._offsets  # [R, Q]
        mask = inference_block_mask(ctx_lens, c, q)  # [R, Q, C+Q]
        hidden = model.backbone(block_ids, block_pos, self._context(rows, c), mask)  # [R, Q, H]
        hidden = hidden[:, cfg.draft_slot_offset :]  # [R, N, H]
        # [R, N, Vd]; a batch-sharded sampler computes vocab shards of it itself.
        base = None if sampler.group is not None else model.compute_draft_logits(hidden)
        t1 = self._clock()

        # Draft j predicts position p+1+j; its draw is keyed by p+j (P_0 = p+1).
        walk = sampler.walk(
            model,
            base,
            hidden,
            anchors,
            temperature,
            seeds,
            ctx_lens + 1,
            want_confidence,
            on_slot_logits,
        )
        t2 = self._clock()
        return Proposal(walk, t1 - t0, t2 - t1)
