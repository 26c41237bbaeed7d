"""`Engine`: DSpark speculative decoding (or target-only decoding) with continuous batching.

One `step()`:
1. admit waiting requests into free slots and prefill them in padded target forwards (grouped
   by length so padding stays under half the tokens): the captured aux states of positions
   0..P-1 become each request's draft context, the logits at P-1 give the first token = the
   first anchor, at position P;
2. one round for every request that was already running:
   - speculative: draft step (batched backbone + Markov loop, `DraftRunner.propose`) -> ONE
     batched target forward over `[anchor, d_1..d_N]` giving the verification logits and the
     aux states of those positions -> accept (greedy: while draft == target argmax; else
     rejection sampling) + bonus token -> the draft context gains the anchor and the accepted
     drafts only, the target KV slot's valid length stops at the same place (the bonus is the
     next anchor, not yet run through the target);
   - target-only: one batched target forward over the anchors.
New requests are prefilled in the step they are admitted and join the rounds from the next
step, so their first token is never delayed by a round.

Verification is batched across requests (one forward over [R, N+1] with per-request KV slots
and a 4D mask), not run per request: measured on CPU (scripts/bench_engine.py) one batched
verify forward at R=4 costs 2.5-3.6x less than four per-request forwards, and the padding it
needs is nil (every row has N+1 queries; only key lengths differ, bucketed to 64).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time

import torch
import torch.distributed as dist
from torch import nn

from common.sampling.acceptance_estimator import OnlineAcceptanceEstimator
from common.sampling.adaptive import SPSTable, plan_verify_lengths
from common.sampling.calibration import apply_temperatures, load_temperatures
from common.sampling.draft_budget import (
    PaddedCostTable,
    plan_budgeted_verify_lengths,
    profile_padded_costs,
)
from common.sampling.sharded import sharding_disabled_reason
from serve.engine.draft_runner import DraftRunner
from serve.engine.kv_cache import round_up
from serve.engine.loader import (
    check_pair,
    check_target,
    eos_ids,
    load_models,
    resolve_num_speculative_tokens,
)
from serve.engine.options import EngineOptions, OptionsError
from serve.engine.request import Request, RequestOutput, SamplingParams, Status
from serve.engine.sampler import Sampler
from serve.engine.scheduler import Scheduler
from serve.engine.stats import EngineStats, SpecDecodeStats, StatLogger
from serve.engine.target_runner import TargetRunner
from serve.engine.text import StopStrings

logger = logging.getLogger("serve.engine")
KV_BUCKET = 64  # key/context lengths are rounded up to this so forward shapes repeat
# Why an aborted request ended, for its counter: a server-side error or cancel, or its client
# going away. Finished requests (stop, length) count as successes.
ABORT_CAUSES = ("abort", "disconnect")


class Engine:
    """Build with `Engine.from_options(opts)` (loads from disk) or `Engine(target, draft, opts)`.

    Methods: `add_request`, `abort_request`, `step`, `has_unfinished`, `generate`; counters in
    `stats` (`EngineStats`, vLLM's spec-decode names). Single-threaded: drive it from one thread.
    """

    def __init__(
        self,
        target: nn.Module,
        draft: nn.Module | None,
        opts: EngineOptions,
        tokenizer=None,
        eos_token_ids: list[int] | None = None,
    ):
        check_target(target)
        self.opts, self.tokenizer = opts, tokenizer
        self.device = next(target.parameters()).device
        self.target_model, self.draft_model = target, draft
        self.eos_token_ids = eos_ids(target, tokenizer) if eos_token_ids is None else eos_token_ids
        self.num_spec = 0
        if draft is not None:
            if not opts.checkpoint_checked:
                check_pair(target, draft.config, tokenizer)
            self.num_spec = resolve_num_speculative_tokens(opts, draft.config)
        # A round writes positions p..p+N with p <= max_model_len - 1.
        capacity = round_up(opts.max_model_len + self.num_spec + 1, KV_BUCKET)
        layer_ids = draft.config.target_layer_ids if draft is not None else None
        self.target = TargetRunner(target, layer_ids, opts.max_num_seqs, capacity, KV_BUCKET)
        self.drafter = (
            DraftRunner(draft, opts.max_num_seqs, capacity, self.num_spec, KV_BUCKET)
            if draft is not None
            else None
        )
        topk = draft.config.dspark_draft_topk if draft is not None else None
        self.adaptive = draft is not None and opts.adaptive_verification
        # Without a confidence head vLLM falls back to its online acceptance estimator.
        self.estimator = (
            OnlineAcceptanceEstimator(opts.max_num_seqs, self.num_spec, self.device)
            if self.adaptive and not draft.config.enable_confidence_head
            else None
        )
        group = self._sampling_group(draft, topk)
        self.sampler = Sampler(opts.draft_sampling, topk, fp64=opts.use_fp64_gumbel, group=group)
        self.cost = self._verify_cost() if self.adaptive else None
        # STS-calibrated confidences for the scheduler, when the checkpoint was calibrated.
        self.conf_temperatures = (
            load_temperatures(opts.checkpoint)
            if self.adaptive and self.estimator is None and opts.checkpoint is not None
            else None
        )
        self.scheduler = Scheduler(opts.max_num_seqs)
        self.requests: dict[str, Request] = {}
        self.stats = EngineStats(SpecDecodeStats(self.num_spec, num_verified_draft_tokens=0))
        self.stat_logger = StatLogger()
        self._ids = itertools.count()
        self._pending: list[RequestOutput] = []

    def _sampling_group(self, draft, topk):
        """The torch.distributed group for batch-sharded sampling, or None (replicated), for
        vLLM's reasons in vLLM's order (common.sampling.sharding_disabled_reason)."""
        tp = self.opts.tp
        if tp == 1:
            return None
        if not dist.is_initialized() or dist.get_world_size() != tp:
            have = dist.get_world_size() if dist.is_initialized() else "no process group"
            raise OptionsError(
                f"tp={tp} needs torch.distributed initialised with {tp} ranks (got {have}): "
                "launch every rank (e.g. torchrun --nproc-per-node N) and call "
                "init_process_group before building the engine."
            )
        if draft is None:
            return None
        reason = sharding_disabled_reason(
            model=draft,
            tp_size=tp,
            use_acceptance_estimator=self.estimator is not None,
            draft_topk=topk,
            communicator=dist.group.WORLD,
        )
        if reason is not None:
            logger.info(
                "DSpark sequential sampling stays replicated across %d ranks: %s", tp, reason
            )
            return None
        logger.info("DSpark sequential sampling is batch-sharded across %d ranks", tp)
        return dist.group.WORLD

    def _verify_cost(self) -> SPSTable | PaddedCostTable:
        """What adaptive verification prices a step with: Algorithm 1's token-count SPS table
        when one is given, else the padded cost table (loaded, or profiled now on the dense
        [R, q] verify batches and the draft steps this engine runs)."""
        opts, n = self.opts, self.num_spec
        if opts.sps_table:
            return SPSTable.load(opts.sps_table)
        if opts.cost_table:
            table = PaddedCostTable.load(opts.cost_table)
            if len(table.draft_ms) <= opts.max_num_seqs or len(table.verify_ms[-1]) < n + 2:
                raise OptionsError(
                    f"cost_table={opts.cost_table}: profiled for fewer than max_num_seqs="
                    f"{opts.max_num_seqs} requests or {n} drafts; profile it again (unset it)."
                )
            return table
        r_max = opts.max_num_seqs
        ids = torch.zeros(r_max, n + 1, dtype=torch.long)
        zeros = torch.zeros(r_max, dtype=torch.long, device=self.device)
        sampler, want_conf = Sampler("greedy"), self.estimator is None

        def draft_step(r: int):
            rows = list(range(r))
            # Free slots at start-up; nothing a profile step writes outlives it.
            self.drafter.propose(
                rows, zeros[:r], zeros[:r] + 1, sampler, zeros[:r].float(), zeros[:r], want_conf
            )

        def verify_step(r: int, q: int):
            self.target.forward(list(range(r)), ids[:r, :q], zeros[:r].cpu())

        table = profile_padded_costs(draft_step, verify_step, r_max, n)
        if opts.tp > 1:  # every rank must schedule alike: rank 0's timings win (as in vLLM)
            box = [table]
            dist.broadcast_object_list(box, src=0)
            table = box[0]
        logger.info("profiled step costs (ms): draft %s verify %s", table.draft_ms, table.verify_ms)
        return table

    def _clock(self) -> float:
        if self.device.type == "cuda":  # time the work, not its launch
            torch.cuda.synchronize()
        return time.perf_counter()

    @classmethod
    def from_options(cls, opts: EngineOptions) -> Engine:
        target, draft, tokenizer = load_models(opts)  # checks the pair unless already checked
        return cls(target, draft, dataclasses.replace(opts, checkpoint_checked=True), tokenizer)

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; raises ValueError for an empty or too long prompt."""
        params = params or SamplingParams()
        n = next(self._ids)
        request_id = request_id or f"req-{n}"
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        if len(prompt_ids) >= self.opts.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; max_model_len={self.opts.max_model_len} "
                "leaves no room to generate"
            )
        vocab = self.target.lm_head.weight.shape[0]
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need the target's tokenizer; use stop_token_ids")
        seed = params.seed if params.seed is not None else (self.opts.seed << 32) + n
        req = Request(request_id, list(prompt_ids), params, seed)
        if params.stop:
            req.stop_strings = StopStrings(self.tokenizer, params.stop)
        self.requests[request_id] = req
        self.scheduler.add(req)
        return request_id

    def abort_request(self, request_id: str, cause: str = "abort") -> bool:
        """Cancel a waiting or running request; its final output (reason "abort") comes with
        the next `step()`. `cause` picks its counter: "abort" (a server-side error or cancel)
        or "disconnect" (its client went away). False, counting nothing, if unknown or already
        finished: every request is counted once, by how it ended first."""
        if cause not in ABORT_CAUSES:
            raise ValueError(f"cause={cause!r}: one of {ABORT_CAUSES}")
        req = self.requests.get(request_id)
        if req is None or req.status is Status.FINISHED:
            return False
        self._finish(req, "abort", cause)
        self._pending.append(RequestOutput(request_id, [], True, "abort"))
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0 or bool(self._pending)

    # ------------------------------------------------------------------ stepping
    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        """Admit + prefill new requests, then one decoding round for the others."""
        outputs, self._pending = self._pending, []
        previously_running = self.scheduler.running_by_slot()
        new = self.scheduler.admit()
        if new:
            outputs += self._prefill(new)
        if previously_running:
            if self.drafter is not None:
                outputs += self._spec_round(previously_running)
            else:
                outputs += self._target_round(previously_running)
        with self.stats.updating():
            self.stats.steps += 1
            self.stats.num_running = len(self.scheduler.running)
            self.stats.num_waiting = len(self.scheduler.waiting)
        if self.drafter is not None:
            self.stat_logger.maybe_log(self.stats)
        for o in outputs:
            if o.finished:
                self.requests.pop(o.request_id, None)
        return outputs

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[int]]:
        """Run the given prompts to completion (batched), returning their output ids in order."""
        return [ids for ids, _ in self.generate_with_rounds(prompts, params)]

    def generate_with_rounds(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[tuple[list[int], list[int]]]:
        """`generate`, with each request's speculative rounds: (output ids, drafts accepted in
        each of its rounds), in order. Summed over requests the rounds are the spec-decode
        counters' drafts and accepted tokens."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        out: dict[str, tuple[list[int], list[int]]] = {i: ([], []) for i in ids}
        done: set[str] = set()
        while len(done) < len(ids):
            for o in self.step():
                if o.request_id in out:
                    out[o.request_id][0].extend(o.new_token_ids)
                    if o.num_accepted is not None:
                        out[o.request_id][1].append(o.num_accepted)
                    if o.finished:
                        done.add(o.request_id)
        return [out[i] for i in ids]

    # ------------------------------------------------------------------ phases
    def _batch_params(self, reqs: list[Request]):
        temps = torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32)
        seeds = torch.tensor([r.seed for r in reqs], dtype=torch.long)
        return temps.to(self.device), seeds.to(self.device)

    def _prefill(self, reqs: list[Request]) -> list[RequestOutput]:
        results = []
        for group in prefill_groups(reqs):
            results += self._prefill_group(group)
        return results

    def _prefill_group(self, reqs: list[Request]) -> list[RequestOutput]:
        t0 = self._clock()
        rows = [r.slot for r in reqs]
        lens = torch.tensor([len(r.prompt_ids) for r in reqs])
        ids = torch.zeros(len(reqs), int(lens.max()), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, : len(r.prompt_ids)] = torch.tensor(r.prompt_ids)
        start = torch.zeros(len(reqs), dtype=torch.long)
        out = self.target.forward(rows, ids, start, (lens - 1).view(-1, 1))
        t1 = self._clock()
        if self.drafter is not None:
            self.drafter.write_context(rows, out.aux, start)
        t2 = self._clock()
        temps, seeds = self._batch_params(reqs)
        lens = lens.to(self.device)
        first = self.sampler.sample_target(out.logits[:, 0], temps, seeds, lens - 1).tolist()
        results = []
        for r, tok in zip(reqs, first, strict=True):
            r.num_computed = len(r.prompt_ids)
            results.append(self._emit(r, [tok]))
        with self.stats.updating():
            self.stats.prompt_tokens += int(lens.sum())
            self.stats.time_prefill += t1 - t0
            self.stats.time_context += t2 - t1
        return results

    def _spec_round(self, reqs: list[Request]) -> list[RequestOutput]:
        rows = [r.slot for r in reqs]
        anchors = torch.tensor([r.anchor for r in reqs], device=self.device)
        lens = torch.tensor([r.num_computed for r in reqs], device=self.device)  # p
        temps, seeds = self._batch_params(reqs)
        rows_t = torch.tensor(rows, device=self.device)
        predicted: list[torch.Tensor] = []
        on_slot_logits = None
        if self.estimator is not None:

            def on_slot_logits(k, logits):
                predicted.append(self.estimator.predict(logits, rows_t, k, temps))

        want_conf = self.adaptive and self.estimator is None
        prop = self.drafter.propose(
            rows, anchors, lens, self.sampler, temps, seeds, want_conf, on_slot_logits
        )
        t0 = self._clock()
        if self.adaptive:
            verify_len = self._plan_verify(reqs, prop.walk.confidence, predicted)
        else:
            verify_len = torch.full((len(reqs),), self.num_spec, device=self.device)
        # Static N+1 queries unless adaptive verification shortened every row's block.
        q = int(verify_len.max()) + 1
        walk = prop.walk.head(q - 1)
        out = self.target.forward(rows, torch.cat([anchors.view(-1, 1), walk.draft_ids], 1), lens)
        verdict = self.sampler.verify(out.logits, walk, temps, seeds, lens + 1, verify_len)
        t1 = self._clock()
        # The draft context gains positions p..p+a (anchor + accepted drafts): rows are written
        # whole, the rejected tail lies past the new length and is overwritten next round.
        self.drafter.write_context(rows, out.aux, lens)
        t2 = self._clock()
        if self.estimator is not None:  # grade this round's predictions
            n_acc = verdict.num_accepted.to(self.device)
            self.estimator.step(rows_t, n_acc + 1, verify_len.to(self.device) - n_acc)
        accepted = verdict.num_accepted.tolist()
        tokens = verdict.tokens.tolist()
        per_pos = verdict.accepted.sum(0).tolist()
        with self.stats.updating():
            # Draft tokens as vLLM counts them: N scheduled per request, whatever adaptive
            # verification then verified (counted apart).
            scheduled = len(reqs) * self.num_spec
            verified = int(verify_len.sum())
            self.stats.spec.add(len(reqs), scheduled, sum(accepted), per_pos, verified)
            self.stats.time_backbone += prop.backbone_s
            self.stats.time_markov += prop.markov_s
            self.stats.time_verify += t1 - t0
            self.stats.time_context += t2 - t1
        results = []
        for r, a, row in zip(reqs, accepted, tokens, strict=True):
            r.num_computed += a + 1
            out = self._emit(r, row[: a + 1])
            out.num_accepted = a
            results.append(out)
        return results

    def _plan_verify(
        self, reqs: list[Request], confidence, predicted: list[torch.Tensor]
    ) -> torch.Tensor:
        """[R] drafts to verify: from the confidence head (STS-calibrated when the checkpoint
        carries temperatures) or the acceptance estimator's predictions, by the chosen policy.
        With adaptive_budget_confidence="previous" the budget comes from each request's previous
        round's confidences (ones for its first round, as vLLM 0.34's `add_request` resets its
        slot) and this round's are kept on the requests for the next."""
        if self.estimator is not None:
            conf = torch.stack(predicted, dim=1)  # [R, N]
        else:
            conf = confidence
            if self.conf_temperatures is not None:
                conf = apply_temperatures(conf, self.conf_temperatures)
        if self.opts.adaptive_policy != "vllm":
            return plan_verify_lengths(conf, self.cost).verify_len.to(self.device)
        if self.opts.adaptive_budget_confidence == "current":
            return plan_budgeted_verify_lengths(conf, self.cost).to(self.device)
        ones = torch.ones(self.num_spec)
        prev = torch.stack([ones if r.last_confidence is None else r.last_confidence for r in reqs])
        lengths = plan_budgeted_verify_lengths(conf, self.cost, budget_confidence=prev)
        for r, row in zip(reqs, conf.detach().float().cpu(), strict=True):
            r.last_confidence = row.clone()
        return lengths.to(self.device)

    def _target_round(self, reqs: list[Request]) -> list[RequestOutput]:
        t0 = self._clock()
        rows = [r.slot for r in reqs]
        anchors = torch.tensor([[r.anchor] for r in reqs])
        lens = torch.tensor([r.num_computed for r in reqs], device=self.device)
        out = self.target.forward(rows, anchors, lens)
        temps, seeds = self._batch_params(reqs)
        toks = self.sampler.sample_target(out.logits[:, 0], temps, seeds, lens).tolist()
        with self.stats.updating():
            self.stats.time_verify += self._clock() - t0
        results = []
        for r, tok in zip(reqs, toks, strict=True):
            r.num_computed += 1
            results.append(self._emit(r, [tok]))
        return results

    # ------------------------------------------------------------------ bookkeeping
    def _emit(self, req: Request, tokens: list[int]) -> RequestOutput:
        """Append tokens up to the first stop condition; finish the request if one is hit."""
        p = req.params
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
        new, reason, stop_str = [], None, None
        for t in tokens:
            new.append(t)
            req.output_ids.append(t)
            if t in stops:
                reason = "stop"
            elif len(req.output_ids) >= p.max_tokens or req.total_len >= self.opts.max_model_len:
                reason = "length"
            if reason:
                break
        if req.stop_strings is not None and new:
            # A stop string may complete mid-round: keep the tokens up to the one completing it.
            hit = req.stop_strings.push(new)
            if hit is not None:
                keep, stop_str = hit
                del req.output_ids[len(req.output_ids) - len(new) + keep :]
                new, reason = new[:keep], "stop"
        with self.stats.updating():
            self.stats.generation_tokens += len(new)
        if reason:
            self._finish(req, reason)
        return RequestOutput(req.request_id, new, reason is not None, reason, stop_str=stop_str)

    def _finish(self, req: Request, reason: str, cause: str = "abort") -> None:
        self.scheduler.finish(req, reason)
        with self.stats.updating():
            if reason != "abort":
                self.stats.requests_finished += 1
            elif cause == "disconnect":
                self.stats.requests_disconnected += 1
            else:
                self.stats.requests_aborted += 1


def prefill_groups(reqs: list[Request], max_pad_fraction: float = 0.5) -> list[list[Request]]:
    """Split newly admitted requests into padded prefill batches: by ascending prompt length,
    a group grows while its padding stays <= `max_pad_fraction` of its padded tokens."""
    groups: list[list[Request]] = []
    for r in sorted(reqs, key=lambda r: len(r.prompt_ids)):
        g = groups[-1] if groups else None
        if g is not None:
            real = sum(len(x.prompt_ids) for x in g) + len(r.prompt_ids)
            padded = (len(g) + 1) * len(r.prompt_ids)  # r is the longest so far
            if padded - real <= max_pad_fraction * padded:
                g.append(r)
                continue
        groups.append([r])
    return [sorted(g, key=lambda r: r.slot) for g in groups]
