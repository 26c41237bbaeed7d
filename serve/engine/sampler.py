"""The engine's one sampling seam: the Markov walk, target sampling and verification.

Everything random in the engine goes through `Sampler`, backed by `common.sampling` (keyed Gumbel
sampling, the Markov walk with its sampled-from distributions, lossless rejection verification
with per-request verify lengths). All-greedy rounds take a plain argmax walk and exact-match
verification (the backend would draw and discard noise for them). `use_fp64_gumbel` is vLLM's
`--use-fp64-gumbel`: float64 noise for draft, correction, bonus and target draws.

Batch-sharded sampling (`group`, a torch.distributed group of tp ranks that all run the same
engine steps on replicated models, as vLLM's `--enable-batch-sharded-sampling` with tp > 1):
request i is owned by rank i % tp; a sampled round's Markov walk runs through
`common.sampling.sharded_markov_walk` (vocab-sharded base logits, all-to-all to batch shards,
the walk on the owned rows, all-gather of drafts) and its rejection sampling on the owned rows
only, whose verdicts are all-gathered. Every draw is keyed by (seed, position), so the result is
bit-identical to the replicated sampler on every rank. Argmax walks (all-greedy rounds,
draft_sampling="greedy") stay replicated: they have no per-row noise to shard, and the
replicated argmax runs in the model's dtype where the sharded walk would run in float32.

Keys follow vLLM's DSpark speculator: the draw producing the token at position P is keyed by
(request seed, P - 1); drafting, accept uniforms and target/bonus draws use separate streams.
A request with temperature <= 0 is greedy whatever the engine mode; with
draft_sampling="greedy" drafts are argmax at any temperature and verified as point masses
(still lossless).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.sampling import Stream, gumbel_sample, markov_walk, rejection_verify
from common.sampling.sharded import all_gather_rows, owner_layout, sharded_markov_walk


@dataclass
class Walk:
    """draft_ids: [R, N] target ids; draft_probs: what they were sampled from (backend object,
    None for greedy drafts); confidence: [R, N] fp32 or None; local_reqs: [cap] the requests
    whose draft_probs rows this rank holds (batch-sharded walk; -1 pads), None = all."""

    draft_ids: torch.Tensor
    draft_probs: object | None
    confidence: torch.Tensor | None
    local_reqs: torch.Tensor | None = None

    def head(self, m: int) -> Walk:
        """The first m slots (adaptive verification runs the target on fewer drafts)."""
        if m == self.draft_ids.shape[1]:
            return self
        dp = self.draft_probs
        if dp is not None:  # common.sampling.DraftProbs: [R, N, C] rows, cols [C] or [R, N, C]
            cols = dp.cols if dp.cols is None or dp.cols.dim() == 1 else dp.cols[:, :m]
            dp = type(dp)(dp.probs[:, :m], cols, dp.token_probs[:, :m], dp.vocab_size)
        conf = None if self.confidence is None else self.confidence[:, :m]
        return Walk(self.draft_ids[:, :m], dp, conf, self.local_reqs)


@dataclass
class Verdict:
    """num_accepted: [R] a_r; tokens: [R, N+1], row r's output is tokens[r, :a_r + 1] (accepted
    drafts then the bonus/correction token); accepted: [R, N] bool prefix mask."""

    num_accepted: torch.Tensor
    tokens: torch.Tensor
    accepted: torch.Tensor


def greedy_walk(model, base, hidden, anchors, want_confidence: bool, on_slot_logits=None) -> Walk:
    """Argmax Markov walk. base: [R, N, Vd], hidden: [R, N, H], anchors: [R]; on_slot_logits as
    in `common.sampling.markov_walk`."""
    prev, state, ids, embeds = anchors, None, [], []
    for j in range(base.shape[1]):
        bias, e, state = model.markov_step(prev, hidden[:, j], state)
        logits = base[:, j] + bias  # [R, Vd]
        if on_slot_logits is not None:
            on_slot_logits(j, logits)
        prev = model.map_draft_to_target(logits.argmax(-1))  # [R] target ids
        ids.append(prev)
        embeds.append(e)
    conf = None
    if want_confidence:
        r, n = base.shape[:2]
        emb = torch.stack(embeds, 1).flatten(0, 1)
        conf = model.compute_confidence(hidden.flatten(0, 1), emb).float().view(r, n)
    return Walk(torch.stack(ids, 1), None, conf)


def greedy_verify(target_logits, draft_ids, verify_len) -> Verdict:
    """Accept while draft == target argmax. target_logits: [R, N+1, V]."""
    target_ids = target_logits.argmax(-1)  # [R, N+1]
    n = draft_ids.shape[1]
    offered = torch.arange(n, device=draft_ids.device) < verify_len.view(-1, 1)
    accepted = ((draft_ids == target_ids[:, :n]) & offered).long().cumprod(1).bool()
    # Accepted drafts equal the target's argmax, so the output row is target_ids itself.
    return Verdict(accepted.sum(1), target_ids, accepted)


class Sampler:
    """mode: "greedy" | "probabilistic" drafting; topk: the checkpoint's dspark_draft_topk;
    fp64: float64 Gumbel noise (vLLM's use_fp64_gumbel).

    Per-row tensors: temperature [R] float, seeds [R] int64.
    """

    def __init__(self, mode: str, topk: int | None = None, fp64: bool = False, group=None):
        self.mode, self.topk, self.fp64 = mode, topk, fp64
        self.group = group  # batch-sharded sampling across these ranks (None: replicated)
        self.sharded_rounds = 0  # sampled rounds that ran sharded (a check that it is used)

    def walk(
        self,
        model,
        base,
        hidden,
        anchors,
        temperature,
        seeds,
        first_pos,
        want_confidence,
        on_slot_logits=None,
    ):
        """The sequential stage. base: [R, N, Vd] base logits U (None: computed here, when
        needed; the sharded walk computes vocab shards instead), hidden: [R, N, H], anchors: [R]
        target ids, first_pos: [R] position P_0 = p + 1 of draft slot 0 (slot k keyed P_0+k-1);
        on_slot_logits(k, logits): each slot's sampled-from logits (the acceptance estimator)."""
        random = bool((temperature > 0).any()) and self.mode == "probabilistic"
        if not random and self.topk is None:
            # All-greedy rounds skip the backend: it draws (and discards) Gumbel noise for
            # greedy rows to keep shapes static, which costs more than the argmax itself here.
            if base is None:
                base = model.compute_draft_logits(hidden)
            return greedy_walk(model, base, hidden, anchors, want_confidence, on_slot_logits)
        temp = temperature if random else torch.zeros_like(temperature)
        if self.group is not None and on_slot_logits is None:
            self.sharded_rounds += 1
            sh = sharded_markov_walk(
                model,
                hidden,
                anchors,
                temp,
                seeds,
                first_pos,
                group=self.group,
                probs="compact" if random else "none",
                with_confidence=want_confidence,
                fp64=self.fp64,
            )
            return Walk(sh.draft_ids, sh.local_probs, sh.confidence, sh.local_reqs)
        if base is None:
            base = model.compute_draft_logits(hidden)
        out = markov_walk(
            model,
            base,
            hidden,
            anchors,
            temp,
            seeds,
            first_pos,
            topk=self.topk,
            probs="compact" if random else "none",
            with_confidence=want_confidence,
            fp64=self.fp64,
            on_slot_logits=on_slot_logits,
        )
        return Walk(out.draft_ids, out.draft_probs, out.confidence)

    def sample_target(self, logits, temperature, seeds, key_pos) -> torch.Tensor:
        """[R, V] target logits -> [R] ids; key_pos = the sampled token's position - 1."""
        if not bool((temperature > 0).any()):
            return logits.argmax(-1)
        return gumbel_sample(
            logits, temperature, seeds, key_pos, stream=Stream.TARGET, fp64=self.fp64
        )

    def verify(
        self, target_logits, walk: Walk, temperature, seeds, first_pos, verify_len
    ) -> Verdict:
        """target_logits: [R, N+1, V] after the anchor and each draft; verify_len: [R] drafts
        to verify (adaptive verification; N otherwise)."""
        r, n = walk.draft_ids.shape
        if n == 0:  # nothing verified anywhere: the bonus is plain sampling from row 0
            tok = self.sample_target(target_logits[:, 0], temperature, seeds, first_pos - 1)
            none = walk.draft_ids.new_zeros(r)
            return Verdict(none, tok.view(r, 1), none.new_zeros(r, 0, dtype=torch.bool))
        if not bool((temperature > 0).any()):
            return greedy_verify(target_logits, walk.draft_ids, verify_len)
        if walk.local_reqs is not None:
            return self._verify_sharded(
                target_logits, walk, temperature, seeds, first_pos, verify_len
            )
        out = rejection_verify(
            walk.draft_ids,
            walk.draft_probs,
            target_logits,
            temperature,
            seeds,
            first_pos,
            verify_len,
            fp64=self.fp64,
        )
        return Verdict(out.num_accepted, out.output_ids, out.accepted)

    def _verify_sharded(self, target_logits, walk, temperature, seeds, first_pos, verify_len):
        """Rejection sampling of this rank's own requests, verdicts all-gathered in batch
        order. Padding rows (-1) verify request 0 and are dropped by the gather's index."""
        r, n = walk.draft_ids.shape
        _, src_idx = owner_layout(r, dist.get_world_size(self.group), walk.draft_ids.device)
        mine = walk.local_reqs.clamp(min=0)
        out = rejection_verify(
            walk.draft_ids[mine],
            walk.draft_probs,
            target_logits[mine],
            temperature[mine],
            seeds[mine],
            first_pos[mine],
            verify_len[mine],
            fp64=self.fp64,
        )
        packed = torch.cat(
            [out.num_accepted.long().view(-1, 1), out.output_ids.long(), out.accepted.long()], 1
        )  # [cap, 1 + (N+1) + N]
        got = all_gather_rows(packed, self.group)[src_idx]  # [R, 2N + 2]
        return Verdict(got[:, 0], got[:, 1 : n + 2], got[:, n + 2 :].bool())
