"""`DSparkDraftModel`: DFlash backbone + DSpark Markov and confidence heads.

DFlash is this model with `markov_rank=0` (no Markov head) and no confidence head; nothing forks.

Two entry points share every parameter and the same attention code:
- `forward_train`: all anchor blocks of a batch of sequences in ONE backbone pass (block queries
  attend `[whole-sequence context K/V ; all blocks' K/V]` under `training_block_mask`), Markov
  inputs teacher-forced. Logits are not built here: the loss fuses `lm_head` and `markov_w2` in
  vocab chunks (`fused_head_weight`).
- inference pieces named as in vLLM's `Qwen3DSparkForCausalLM` (`compute_draft_logits`,
  `markov_embed`, `markov_bias`, `compute_confidence`, `map_draft_to_target`,
  `compute_draft_logits_local`) plus `context_kv` / `backbone` for the engine's block pass and
  `markov_step`, the head-agnostic sequential step.

Parameter names are the checkpoint keys of docs/vllm-contract.md (no `model.` prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from common.config import DSparkConfig
from common.model.heads import ConfidenceHead, MarkovHead
from common.model.layers import DraftLayer, RMSNorm, Rotary, rotary
from common.model.masks import training_block_mask, training_block_mask_flex


@dataclass
class TrainForward:
    """Per (sequence n, anchor a, draft slot j); draft j predicts x_{p+1+j}. Which position that
    is, and whether it counts, is `block_label_positions`' (the loss's targets read it there).

    hidden:    [N, A, Nd, H]  post-final-norm hidden feeding lm_head / confidence head
    prev_ids:  [N, A, Nd]     teacher-forced previous token (x_{p+j}; j=0 is the anchor)
    markov_embed: [N, A, Nd, r] W1[prev] (r = 0 without a Markov head)
    markov_input: [N, A, Nd, r] u with bias = markov_w2(u)
    """

    hidden: torch.Tensor
    prev_ids: torch.Tensor
    markov_embed: torch.Tensor
    markov_input: torch.Tensor


def block_label_positions(
    anchors: torch.Tensor,  # [N, A]
    anchor_valid: torch.Tensor,  # [N, A] bool
    num_draft: int,
    seq_len: int,
    doc_ids: torch.Tensor | None = None,  # [N, T]
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (label_pos, in_range), each [N, A, Nd]: draft j of the block at anchor p predicts the
    token at p+1+j (clamped to T-1, so it can always be gathered); it counts only when that is
    inside the sequence, the anchor is valid and, with `doc_ids`, in the anchor's document. The
    one place of this bookkeeping: the draft's teacher-forced inputs and the loss's targets."""
    n = anchors.shape[0]
    j = torch.arange(num_draft, device=anchors.device)
    label_pos = anchors.unsqueeze(-1) + 1 + j
    in_range = (label_pos < seq_len) & anchor_valid.unsqueeze(-1)
    label_pos = label_pos.clamp(max=seq_len - 1)
    if doc_ids is not None:
        label_doc = doc_ids.gather(1, label_pos.view(n, -1)).view_as(label_pos)
        in_range = in_range & (label_doc == doc_ids.gather(1, anchors).unsqueeze(-1))
    return label_pos, in_range


class DSparkDraftModel(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.config = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.fc_input_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        # Frozen, from the target: its embedding, and its lm_head rows for the draft vocab.
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h).requires_grad_(False)
        self.lm_head = nn.Linear(h, cfg.draft_vocab, bias=False).requires_grad_(False)
        self.markov_head = MarkovHead(cfg) if cfg.has_markov else None
        self.confidence_head = ConfidenceHead(cfg) if cfg.enable_confidence_head else None
        # target = draft + d2t[draft]; zeros = identity (full vocab).
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        # Training attention: "sdpa" (dense boolean block mask) or "flex" (a BlockMask that skips
        # the key tiles a block cannot see). Same result; not part of the checkpoint.
        self.train_attention = "sdpa"

    # ------------------------------------------------------------------ set-up
    @torch.no_grad()
    def init_from_target(self, embed_weight, lm_head_weight, d2t=None, t2d=None) -> None:
        """Copy the target's embedding [V, H] and lm_head [V, H] (rows t2d for a reduced vocab)."""
        cfg = self.config
        if embed_weight.shape != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(
                f"target embedding is {tuple(embed_weight.shape)}, draft config expects "
                f"[{cfg.vocab_size}, {cfg.hidden_size}]: vocab_size/hidden_size must match the "
                "target."
            )
        self.embed_tokens.weight.copy_(embed_weight)
        if cfg.reduced_vocab:
            if d2t is None or t2d is None:
                raise ValueError("a reduced draft vocab needs d2t and t2d (common.vocab)")
            self.d2t.copy_(d2t)
            self.t2d.copy_(t2d)
            lm_head_weight = lm_head_weight[t2d]
        self.lm_head.weight.copy_(lm_head_weight)

    @property
    def draft_ids_in_target(self) -> torch.Tensor:
        """[Vd] target id of every draft id."""
        return torch.arange(self.config.draft_vocab, device=self.d2t.device) + self.d2t

    # ------------------------------------------------------------------ backbone
    def fuse_context(self, ctx_states: torch.Tensor) -> torch.Tensor:
        """[..., L*T] concatenated target hidden states -> [..., H] = hidden_norm(fc(.))."""
        return self.hidden_norm(self.fc(ctx_states.to(self.fc.weight.dtype)))

    def context_kv(self, ctx_states: torch.Tensor, positions: torch.Tensor):
        """Per-layer context K/V. ctx_states: [N, C, L*T], positions: [N, C]
        -> list over layers of (k, v), each [N, C, nkv, hd] (k normed and rotated)."""
        c = self.fuse_context(ctx_states)
        rot = self.rotary(positions)
        return [layer.self_attn.kv(c, rot) for layer in self.layers]

    def rotary(self, positions: torch.Tensor) -> Rotary:
        """The rotary cos/sin every layer applies at these positions (computed once)."""
        cfg = self.config
        return rotary(positions, cfg.head_dim, cfg.rope_theta, self.fc.weight.dtype)

    def backbone(self, block_ids, block_pos, ctx_kv, mask) -> torch.Tensor:
        """block_ids/block_pos: [N, Q]; ctx_kv: from `context_kv`; mask: [N, Q, C+Q]
        -> [N, Q, H] post-final-norm hidden."""
        x = self.embed_tokens(block_ids).to(self.fc.weight.dtype)
        rot = self.rotary(block_pos)
        for layer, kv in zip(self.layers, ctx_kv, strict=True):
            x = layer(x, rot, kv, mask)
        return self.norm(x)

    def block_input_ids(self, anchor_ids: torch.Tensor) -> torch.Tensor:
        """[...] anchor tokens -> [..., B] = [x_p, MASK, ..., MASK] (both layouts)."""
        cfg = self.config
        blk = anchor_ids.new_full((*anchor_ids.shape, cfg.block_size), cfg.mask_token_id)
        blk[..., 0] = anchor_ids
        return blk

    # ------------------------------------------------------------------ training
    def forward_train(
        self,
        ctx_states: torch.Tensor,  # [N, T, L*Ht] captured target hidden states
        input_ids: torch.Tensor,  # [N, T]
        anchors: torch.Tensor,  # [N, A] anchor positions (padding anchors: any valid index)
        anchor_valid: torch.Tensor,  # [N, A] bool
        position_ids: torch.Tensor | None = None,  # [N, T] (restart per packed document)
        doc_ids: torch.Tensor | None = None,  # [N, T]
    ) -> TrainForward:
        cfg = self.config
        n, t = input_ids.shape
        a, b, nd = anchors.shape[1], cfg.block_size, cfg.num_speculative_tokens
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(n, t)
        ctx_kv = self.context_kv(ctx_states, position_ids)
        offs = torch.arange(b, device=anchors.device)
        block_ids = self.block_input_ids(input_ids.gather(1, anchors))  # [N, A, B]
        block_pos = position_ids.gather(1, anchors).unsqueeze(-1) + offs  # [N, A, B]
        if self.train_attention == "flex":
            mask = training_block_mask_flex(anchors, t, b, doc_ids)
        else:
            mask = training_block_mask(anchors, t, b, doc_ids)
        hidden = self.backbone(block_ids.view(n, a * b), block_pos.view(n, a * b), ctx_kv, mask)
        hidden = hidden.view(n, a, b, -1)[:, :, cfg.draft_slot_offset : cfg.draft_slot_offset + nd]

        label_pos, _ = block_label_positions(anchors, anchor_valid, nd, t)
        prev_ids = input_ids.gather(1, (label_pos - 1).view(n, -1)).view(n, a, nd)
        e, u = self.markov_inputs(prev_ids, hidden)
        return TrainForward(hidden, prev_ids, e, u)

    def markov_inputs(self, prev_ids, hidden):
        """Teacher-forced (e, u), each [..., Nd, r]; empty (r = 0) without a Markov head."""
        if self.markov_head is None:
            empty = hidden.new_zeros((*hidden.shape[:-1], 0))
            return empty, empty
        return self.markov_head.teacher_forced(prev_ids, hidden)

    def fused_head_weight(self) -> torch.Tensor:
        """[Vd, H + r]: logits = [h ; u] @ W.T equals lm_head(h) + markov_w2(u)."""
        if self.markov_head is None:
            return self.lm_head.weight
        return torch.cat([self.lm_head.weight, self.markov_head.markov_w2.weight], dim=1)

    def block_logits(self, hidden: torch.Tensor, markov_input: torch.Tensor) -> torch.Tensor:
        """Unchunked draft logits [..., Vd]; for small vocabs, tests and evaluation."""
        w = self.fused_head_weight()
        return torch.cat([hidden, markov_input.to(hidden.dtype)], dim=-1) @ w.T.to(hidden.dtype)

    # ------------------------------------------------------------------ inference (vLLM names)
    def compute_draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[M, H] -> [M, Vd] base draft logits U (no Markov bias, draft-id space)."""
        return self.lm_head(hidden)

    def compute_draft_logits_local(self, hidden, rank: int, world_size: int) -> torch.Tensor:
        """This rank's vocab shard of `compute_draft_logits`: [M, cdiv(Vd, world)], columns
        past Vd are -inf (vLLM pads the sharded lm_head the same way)."""
        vd = self.config.draft_vocab
        shard = -(-vd // world_size)
        lo, hi = rank * shard, min((rank + 1) * shard, vd)
        out = hidden.new_full((hidden.shape[0], shard), float("-inf"))
        if hi > lo:
            out[:, : hi - lo] = hidden @ self.lm_head.weight[lo:hi].T
        return out

    def markov_embed(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """[R] target ids -> [R, r]."""
        if self.markov_head is None:
            return self.fc.weight.new_zeros((*prev_ids.shape, 0))
        return self.markov_head.embed(prev_ids)

    def markov_bias(self, markov_embed: torch.Tensor) -> torch.Tensor:
        """Vanilla transition bias [R, r] -> [R, Vd] (vLLM semantics)."""
        if self.markov_head is None:
            return markov_embed.new_zeros((*markov_embed.shape[:-1], self.config.draft_vocab))
        return self.markov_head.markov_w2(markov_embed)

    def markov_step(self, prev_ids, hidden, state=None):
        """One sequential slot for any head type.
        prev_ids [R], hidden [R, H], state -> (bias [R, Vd], embed [R, r], state)."""
        e = self.markov_embed(prev_ids)
        if self.markov_head is None:
            return self.markov_bias(e), e, state
        u, state = self.markov_head.step(e, hidden, state)
        return self.markov_head.markov_w2(u), e, state

    def compute_confidence(self, hidden: torch.Tensor, markov_embed: torch.Tensor):
        """[M, H], [M, r] -> [M] fp32 acceptance probabilities."""
        if self.confidence_head is None:
            raise RuntimeError("this draft has no confidence head (enable_confidence_head=false)")
        return torch.sigmoid(self.confidence_head.logits(hidden, markov_embed))

    def map_draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        if not self.config.reduced_vocab:
            return draft_ids
        return draft_ids + self.d2t[draft_ids]

    def map_target_to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 where the id is outside the draft vocabulary."""
        index = torch.cumsum(self.t2d.long(), 0) - 1
        return torch.where(self.t2d[target_ids], index[target_ids], -1)
