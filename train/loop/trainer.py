"""The distillation loop: frozen target -> captured layers + teacher -> draft loss -> AdamW.

One optimizer step = `grad_accum` micro-batches per rank. Their anchors and loss denominators are
computed first and summed over micro-batches and ranks, so each micro-batch backprops
`num_local / den_global` (x world size, undoing DDP's gradient averaging): the global (num, den)
ratio, divided last, independent of how the batch is split.

Host work ahead: while the device runs a step's backward, the host draws the next step's batches
(CPU, pinned), samples their anchors, and plans the loss's rows (`train.loop.vocab_loss.plan_rows`);
then one sync reads the step's flags (loss and target states finite, grad norm), its metrics are
read while the device is idle after it, and the optimizer is queued last, so no sync waits for it.
A skipped step leaves the step count as it was, and the batches drawn ahead are anchored again for
it; checkpoints keep the data position before them. The training is the same, bit for bit, as
drawing each step at its start.

Divergence: a non-finite micro-batch loss or gradient norm (agreed over ranks) cancels the step
before the optimizer sees it: no update, no scheduler step. Up to `trainer.max_bad_batches` such
batches are skipped (counted as `bad_batches` in the train metrics, each logged as a `skip` record
with its rows); the next one stops the run with `TrainingDiverged` naming the step and the training
rows, after saving (or re-marking) the state before that step as `LAST_GOOD`, so `resume=true`
continues from there exactly.

Signals: SIGTERM or SIGINT during `fit` (a preempted job, Ctrl-C) stop the run after the step
under way, agreed over ranks in the same flags sync, with that step's state saved; evaluations
still due and the export are skipped (`train.loop.stop_signals`).
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast
from tqdm.auto import tqdm

from common.model import DSparkDraftModel
from common.target import TargetCapture, require_finite_target, target_head_weights
from train.data import build_dataloader
from train.data.sampler import epoch_order
from train.errors import SetupError
from train.loop.anchors import answer_head_mask, valid_anchor_mask
from train.loop.blocks import anchor_blocks, blocks_at, capture_batch
from train.loop.loss import loss_weights, summarize, weighted_loss
from train.loop.metrics import RunLogger
from train.loop.objective import DistillObjective
from train.loop.optim_groups import param_groups
from train.loop.schedule import TimedHorizon, make_schedule, steady_eval_seconds
from train.loop.state import (
    checkpoint_dirs,
    latest_checkpoint,
    load_checkpoint_state,
    mark_last_good,
    save_checkpoint_state,
)
from train.loop.stop_signals import RunStopped, StopSignals, agreed_signal
from train.loop.vocab_loss import plan_rows
from train.loop.walk_anchors import walk_anchors


class TrainingDiverged(FloatingPointError):
    """A non-finite loss or gradient norm with no bad-batch allowance left; the message names the
    step, the rows and the checkpoint to resume from."""


@dataclass
class Drawn:
    """One optimizer step's micro-batches: the loader's state before them, their positions (for
    naming rows), the CPU batches, and (device batch, anchors, valid, BlockTargets) per micro-batch
    with the anchors keyed to `step`."""

    loader_before: dict
    positions: list[tuple[int, int]]
    hosts: list[dict]
    micro: list[tuple]
    step: int


@dataclass
class RunResult:
    step: int
    train: dict
    eval: dict | None
    eval_initial: dict | None


class Trainer:
    def __init__(
        self,
        cfg,
        accelerator: Accelerator,
        target,
        draft: DSparkDraftModel,
        train_ds,
        eval_ds,
        output_dir,
        fingerprint: dict,
        run_config: dict,
    ):
        self.cfg, self.acc, self.target = cfg, accelerator, target
        self.output_dir, self.fingerprint = output_dir, fingerprint
        tc = cfg.trainer
        if tc.max_bad_batches < 0:
            raise SetupError(f"trainer.max_bad_batches={tc.max_bad_batches}: must be >= 0")
        # Its finite check is read with the step's other flags, in the one sync that reads them.
        self.capture = TargetCapture(target, draft.config.target_layer_ids)
        self.teacher_head = target_head_weights(target)[1]
        objective = DistillObjective(draft, cfg.loss, tc.get("compile_loss", False))
        o = cfg.optim
        # the scale and the head's decay are checked in config_io
        params = param_groups(
            objective, draft.markov_head, o.lr, o.markov_lr_scale, o.markov_weight_decay
        )
        opt = torch.optim.AdamW(
            params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
        )
        try:
            self.schedule = make_schedule(o, tc.max_steps)
        except ValueError as e:
            raise SetupError(str(e)) from e
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.schedule)
        self.objective, self.opt = accelerator.prepare(objective, opt)
        # Not prepared: accelerate would step a prepared scheduler once per process (it assumes
        # the global batch grows with the world size), which changes the LR curve under DDP.
        self.sched = sched
        accelerator.register_for_checkpointing(sched)
        self.rank, self.world = accelerator.process_index, accelerator.num_processes
        self.loader = build_dataloader(
            train_ds,
            tc.micro_batch_size,
            seed=cfg.seed,
            rank=self.rank,
            world_size=self.world,
            num_workers=tc.num_workers,
            pin_memory=accelerator.device.type == "cuda",
        )
        if len(self.loader) == 0:
            raise RuntimeError(
                f"training data gives no full batch of {tc.micro_batch_size} x {self.world} rows "
                "per rank: lower trainer.micro_batch_size or add data"
            )
        self.train_ds, self.eval_ds = train_ds, eval_ds
        self.step = 0
        self.bad_batches = 0  # non-finite batches skipped so far (trainer.max_bad_batches)
        self.eval_batch_s: list[float] = []  # the last evaluation's seconds per batch
        self._iter = None
        self._ahead: Drawn | None = None  # the next step's batches, drawn during this one
        self.signals = StopSignals()  # installed by `fit`
        self.stop_for: int | None = None  # a signal every rank agreed to stop for
        ckpt = latest_checkpoint(output_dir) if cfg.resume else None
        if ckpt is not None:
            state = load_checkpoint_state(accelerator, ckpt, fingerprint)
            self.step = int(state["step"])
            self.bad_batches = int(state.get("bad_batches", 0))
            self.loader.load_state_dict(state["loader"])
            accelerator.print(f"[distill] resumed from {ckpt} at step {self.step}")
        self.log = RunLogger(
            output_dir, cfg.logger, run_config, accelerator.is_main_process, self.step
        )

    # ------------------------------------------------------------------ data
    def _next_batch(self) -> dict[str, torch.Tensor]:
        """The loader's next batch, on the CPU."""
        while True:
            if self._iter is None:
                self._iter = iter(self.loader)
            batch = next(self._iter, None)
            if batch is not None:
                return batch
            self._iter = None  # epoch finished; the loader advanced its epoch

    def _prepare(self, batch, step: int, host: dict | None = None):
        cfg = self.cfg
        draft = self.acc.unwrap_model(self.objective).draft
        return anchor_blocks(
            batch,
            draft.config,
            draft.t2d,
            cfg.trainer.num_anchors,
            cfg.seed,
            step,
            cfg.loss.decay,
            host,
        )

    def _draw(self, step: int) -> Drawn:
        """One optimizer step's micro-batches, on the device, anchors keyed to `step`."""
        loader_before, positions, hosts = self.loader.state_dict(), [], []
        for _ in range(self.cfg.trainer.grad_accum):
            hosts.append(self._next_batch())
            positions.append(self._position())
        drawn = Drawn(loader_before, positions, hosts, [], step)
        return self._anchor(drawn, step)

    def _anchor(self, drawn: Drawn, step: int) -> Drawn:
        """`drawn`'s batches on the device with their anchors keyed to `step`, and the loss's
        rows planned (host syncs, after every batch's host work so none of it waits for them)."""
        micro = []
        for host in drawn.hosts:
            batch = {k: v.to(self.acc.device, non_blocking=True) for k, v in host.items()}
            if self.cfg.trainer.anchor_sampling == "walk":
                # the anchors need this step's draft and target capture: _walk_micro draws them
                micro.append((batch, None, None, None))
            else:
                micro.append((batch, *self._prepare(batch, step, host)))
        lc = self.cfg.loss
        for batch, _, _, tg in micro:
            if tg is not None:
                seq_len = batch["input_ids"].shape[1]
                tg.plan = plan_rows(tg, seq_len, lc.share_teacher, lc.chunk_tokens)
        drawn.micro, drawn.step = micro, step
        return drawn

    def _take_drawn(self) -> Drawn:
        """This step's batches: those drawn ahead during the last step (anchored again if that
        step was skipped, so the anchors are those a step-by-step run draws), else new ones."""
        drawn, self._ahead = self._ahead, None
        if drawn is None:
            return self._draw(self.step)
        return drawn if drawn.step == self.step else self._anchor(drawn, self.step)

    def _loader_state(self) -> dict:
        """The data position after the last finished step (before any batches drawn ahead)."""
        return self._ahead.loader_before if self._ahead else self.loader.state_dict()

    def _position(self) -> tuple[int, int]:
        """(epoch, consumed) of the batch just drawn: it holds rows [consumed - B*W, consumed)."""
        return self.loader.epoch, self.loader.consumed

    def _rows_of(self, positions: list[tuple[int, int]]) -> list[int]:
        """Indices into the training dataset (every rank) of the batches drawn at `positions`."""
        tc, n = self.cfg.trainer, len(self.train_ds)
        per_step = tc.micro_batch_size * self.world
        rows = []
        for epoch, consumed in positions:
            order = epoch_order(n, self.cfg.seed, epoch, shuffle=self.loader.shuffle)
            rows += [int(i) for i in order[consumed - per_step : consumed]]
        return rows

    def _describe_rows(self, rows: list[int]) -> str:
        text = (
            f"training rows {rows} (indices into the tokenized, packed training set of "
            f"data.train={self.cfg.data.train!r} built with seed={self.cfg.seed})"
        )
        cols = self.train_ds.column_names
        source = next((c for c in ("row_index", "source_rows", "row_ids") if c in cols), None)
        if source is not None:
            text += f"; source rows of data.train: {[self.train_ds[i][source] for i in rows]}"
        return text

    def _reduce(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: self.acc.reduce(v.detach().float(), reduction="sum") for k, v in sums.items()}

    # ------------------------------------------------------------------ steps
    def _walk_micro(self, drawn: Drawn) -> list:
        """trainer.anchor_sampling=walk: each micro-batch's target capture, and its anchors drawn
        again among those greedy rounds of the current draft visit (train/loop/walk_anchors.py).
        -> the captures, in micro-batch order; `drawn.micro` is rewritten with the new anchors."""
        cfg, caps, micro, shares = self.cfg, [], [], []
        draft = self.acc.unwrap_model(self.objective).draft
        for host, (batch, *_) in zip(drawn.hosts, drawn.micro, strict=True):
            cap = capture_batch(self.capture, batch)
            with torch.no_grad(), self.acc.autocast():
                anchors, valid, visited = walk_anchors(
                    draft,
                    cap.aux,
                    cap.final,
                    self.teacher_head,
                    batch,
                    cfg.trainer.num_anchors,
                    cfg.seed,
                    drawn.step,
                    host,
                )
            lc = cfg.loss
            tg = blocks_at(batch, draft.config, draft.t2d, anchors, valid, lc.decay)
            tg.plan = plan_rows(tg, batch["input_ids"].shape[1], lc.share_teacher, lc.chunk_tokens)
            caps.append(cap)
            micro.append((batch, anchors, valid, tg))
            shares.append(
                (visited.sum(), valid_anchor_mask(batch["loss_mask"], batch.get("doc_ids")).sum())
            )
        drawn.micro = micro
        # this rank's share of valid anchors the rounds visit (1 for a draft that accepts nothing)
        self._walk_share = float(sum(v for v, _ in shares) / max(1, sum(a for _, a in shares)))
        return caps

    def train_step(self) -> dict:
        drawn = self._take_drawn()
        caps = self._walk_micro(drawn) if self.cfg.trainer.anchor_sampling == "walk" else None
        dens = {}
        for _, _, _, tg in drawn.micro:
            for k, v in tg.dens().items():
                dens[k] = dens.get(k, 0) + v
        dens = self._reduce(dens)
        totals: dict[str, torch.Tensor] = {}
        tokens = 0
        finite = torch.ones((), device=self.acc.device)
        target_finite = torch.ones((), dtype=torch.bool, device=self.acc.device)
        for i, (batch, anchors, valid, tg) in enumerate(drawn.micro):
            cap = caps[i] if caps is not None else capture_batch(self.capture, batch)
            target_finite = target_finite & cap.finite()
            sync = i == len(drawn.micro) - 1
            ctx = contextlib.nullcontext() if sync else self.acc.no_sync(self.objective)
            with ctx:
                loss, sums = self.objective(
                    cap.aux, cap.final, self.teacher_head, batch, anchors, valid, tg, dens
                )
                self.acc.backward(loss * self.world)
            finite = finite * torch.isfinite(loss.detach()).all().float()
            for k, v in sums.items():
                totals[k] = totals.get(k, 0) + v
            tokens += batch["input_ids"].numel()
        grad_norm = self.acc.clip_grad_norm_(self.objective.parameters(), self.cfg.optim.clip)
        # The next step's batches, anchors and loss rows: host work done while the device runs
        # this step (their syncs wait for its backward, as the flags' sync below would).
        self._ahead = self._draw(self.step + 1)
        stops = self.signals.flags()
        parts = [
            self.acc.reduce(finite, reduction="sum")[None],
            target_finite.float()[None],
            torch.as_tensor(grad_norm, device=finite.device).float()[None],
        ]
        if self.world > 1:  # one rank's signal stops them all: summed within this one sync
            parts.append(self.acc.reduce(torch.tensor(stops, device=finite.device), "sum"))
        flags = torch.cat(parts).tolist()
        self.stop_for = agreed_signal(flags[3:] if self.world > 1 else stops)
        require_finite_target(flags[1])
        # One rank's bad loss must cancel the step everywhere (the grad norm is already global).
        bad_ranks, grad_norm = self.world - flags[0], flags[2]
        if bad_ranks > 0 or not math.isfinite(grad_norm):
            self.opt.zero_grad(set_to_none=True)
            what = "loss" if bad_ranks > 0 else "gradient norm"
            return {
                "skipped": True,
                "reason": f"non-finite {what} (grad_norm={grad_norm})",
                "rows": self._rows_of(drawn.positions),
                "loader_before": drawn.loader_before,
            }
        # Read the metrics while the device is idle after the flags' sync, so the optimizer's
        # kernels run on while the host goes on to the next step.
        out = summarize(self._reduce(totals))
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        out["loss"] = weighted_loss(out, loss_weights(self.cfg.loss))
        out["grad_norm"] = grad_norm
        out["lr"] = self.sched.get_last_lr()[0]
        out["tokens"] = tokens * self.world
        out["bad_batches"] = self.bad_batches
        if caps is not None:
            out["walk_visited_share"] = self._walk_share
        return out

    @torch.no_grad()
    def evaluate(self) -> dict | None:
        if self.eval_ds is None or len(self.eval_ds) == 0:
            return None
        cfg = self.cfg
        loader = build_dataloader(
            self.eval_ds,
            cfg.trainer.micro_batch_size,
            seed=cfg.seed,
            rank=self.rank,
            world_size=self.world,
            shuffle=False,
            drop_last=False,
        )
        head = cfg.trainer.eval_answer_head
        totals: dict[str, dict[str, torch.Tensor]] = {"": {}, "answer_head_": {}}
        self.objective.eval()
        self.eval_batch_s = []
        for i, batch in enumerate(loader):
            if i >= cfg.trainer.eval_batches:
                break
            t = time.perf_counter()
            batch = {k: v.to(self.acc.device) for k, v in batch.items()}
            cap = capture_batch(self.capture, batch)
            views = [("", batch)]
            if head:
                mask = answer_head_mask(batch["loss_mask"], head, batch.get("doc_ids"))
                views.append(("answer_head_", {**batch, "loss_mask": mask}))
            for prefix, view in views:
                anchors, valid, tg = self._prepare(view, -1)  # fixed anchors for every eval
                dens = self._reduce(tg.dens())
                _, sums = self.objective(
                    cap.aux, cap.final, self.teacher_head, view, anchors, valid, tg, dens
                )
                for k, v in sums.items():
                    totals[prefix][k] = totals[prefix].get(k, 0) + v
            if self.acc.device.type == "cuda":
                torch.cuda.synchronize(self.acc.device)
            self.eval_batch_s.append(time.perf_counter() - t)
        self.objective.train()
        if not totals[""]:
            return None
        out = summarize(self._reduce(totals[""]))
        if totals["answer_head_"]:
            part = summarize(self._reduce(totals["answer_head_"]))
            out["answer_head_tokens"] = head
            keys = ("analytic_tau", "acceptance_per_pos", "greedy_tau", "greedy_acceptance_per_pos")
            out.update({f"answer_head_{k}": part[k] for k in keys if k in part})
        return out

    def save(self, loader_state: dict | None = None):
        state = {
            "loader": loader_state or self._loader_state(),
            "fingerprint": self.fingerprint,
            "bad_batches": self.bad_batches,
        }
        return save_checkpoint_state(
            self.acc, self.output_dir, self.step, state, self.cfg.trainer.keep_last
        )

    def _skip_or_stop(self, bad: dict) -> None:
        """Skip the bad batch while the allowance lasts; else keep the state before it and stop."""
        tc, step = self.cfg.trainer, self.step + 1
        rows = self._describe_rows(bad["rows"])
        if self.bad_batches < tc.max_bad_batches:
            self.bad_batches += 1
            self.acc.print(
                f"[distill] step {step}: {bad['reason']}; skipped batch {self.bad_batches}/"
                f"{tc.max_bad_batches} (no optimizer step): {rows}"
            )
            self.log.log(
                self.step,
                "skip",
                {"reason": bad["reason"], "rows": bad["rows"], "bad_batches": self.bad_batches},
            )
            return
        # No update happened, so the weights, optimizer and scheduler are still those after step
        # `self.step`; with the data position from before this batch this is that step's state.
        done = {p.name: p for p in checkpoint_dirs(self.output_dir)}
        ckpt = done.get(f"step-{self.step:06d}")
        if self.step == 0:
            ckpt = None
        elif ckpt is None:
            ckpt = self.save(bad["loader_before"])
        elif self.acc.is_main_process:
            mark_last_good(self.output_dir, ckpt)
        self.log.close()
        resume = (
            f"The state after step {self.step} is kept in {ckpt} (marked LAST_GOOD): fix the data "
            "or lower optim.lr and rerun with resume=true, or set trainer.max_bad_batches=N to "
            "skip up to N such batches"
            if ckpt is not None
            else "Nothing was trained yet: fix the data or the learning rate and start again"
        )
        raise TrainingDiverged(
            f"training diverged at step {step}: {bad['reason']} on {rows}; "
            f"{self.bad_batches} bad batch(es) already skipped (trainer.max_bad_batches="
            f"{tc.max_bad_batches}). {resume}."
        )

    def _out_of_time(self, t0: float) -> bool:
        """trainer.max_seconds spent; every rank takes the main process's clock, so all stop
        after the same step."""
        limit = self.cfg.trainer.max_seconds
        if not limit:
            return False
        return bool(self._from_main(time.perf_counter() - t0 >= limit))

    def _from_main(self, value: float) -> float:
        """The main process's `value` on every rank (one small collective; a single process
        needs no device)."""
        if self.acc.num_processes == 1:
            return value
        flag = torch.tensor(float(value), device=self.acc.device)
        return broadcast(flag, from_process=0).item()

    def _plan(self, horizon: int, timed: TimedHorizon, bar) -> None:
        """Fix the schedule's horizon to what the time budget holds (a re-plan only where the
        rate now stays as it is); every rank takes the main process's plan, so all stop after
        the same step."""
        horizon = int(self._from_main(horizon))
        first = not self.schedule.planned
        timed.planned(self.step, horizon, self.schedule.replannable)
        tc, evals = self.cfg.trainer, timed.overhead_per_step_s
        how = (
            f"to end within trainer.max_seconds={tc.max_seconds:g}: {timed.rate_s:.3f} s a step "
            f"over steps {timed.window[0]}-{timed.window[1]}"
            + (f" and {evals:.3f} s a step of evaluations" if evals else "")
        )
        if not first and not self.schedule.same_rate_at(self.step, horizon):
            self.acc.print(
                f"[distill] kept the schedule's {self.schedule.horizon} steps: {horizon} steps "
                f"{how} would change the learning rate at step {self.step}"
            )
            return
        self.schedule.horizon, self.schedule.planned = horizon, True
        bar.total = horizon
        self.acc.print(
            f"[distill] learning-rate schedule {'planned' if first else 're-planned'} for "
            f"{horizon} steps (max_steps {tc.max_steps}) {how}"
        )

    def fit(self) -> RunResult:
        with self.signals:
            return self._fit()

    def _stop(self, bar) -> None:
        """Stop for the agreed signal after this step, its state saved."""
        ckpt = self.save()
        bar.close()
        self.log.log(self.step, "stop", {"signal": signal.Signals(self.stop_for).name})
        self.log.close()
        raise RunStopped(self.stop_for, self.step, ckpt)

    def _fit(self) -> RunResult:
        tc = self.cfg.trainer
        main = self.acc.is_main_process
        eval_initial, eval_s = None, 0.0
        if self.step == 0:
            t = time.perf_counter()
            eval_initial = self.evaluate()
            # Not its wall time: that holds the evaluation graphs' compiles, paid once.
            eval_s = steady_eval_seconds(self.eval_batch_s)
            if self.eval_batch_s:
                self.acc.print(
                    f"[distill] step-0 evaluation: {time.perf_counter() - t:.1f} s, "
                    f"{eval_s:.1f} s once compiled ({len(self.eval_batch_s)} batches)"
                )
            if eval_initial:
                self.log.log(0, "eval", eval_initial)
        timed = None
        if tc.max_seconds and tc.schedule_to_time and not self.schedule.planned:
            overhead = eval_s / tc.eval_every if tc.eval_every else 0.0
            timed = TimedHorizon(tc.max_seconds, tc.max_steps, self.step, overhead)
        bar = tqdm(
            total=self.schedule.horizon,
            initial=self.step,
            disable=not (main and tc.progress),
            desc="distill",
            dynamic_ncols=True,
        )
        last, t0 = {}, time.perf_counter()
        while self.step < self.schedule.horizon:
            t = time.perf_counter()
            out = self.train_step()
            if out.get("skipped"):
                self._skip_or_stop(out)
                continue
            last = out
            self.step += 1
            last["tokens_per_s"] = last["tokens"] / (time.perf_counter() - t)
            end = self.schedule.horizon
            if self.step % tc.log_every == 0 or self.step == end:
                self.log.log(self.step, "train", last)
            bar.set_postfix(loss=f"{last['loss']:.3f}", tau=f"{last['analytic_tau']:.2f}")
            if tc.print_every and (self.step == 1 or self.step % tc.print_every == 0):
                self.acc.print(
                    f"[distill] step {self.step}/{end} loss {last['loss']:.3f} "
                    f"tau {last['analytic_tau']:.2f} {last['tokens_per_s']:,.0f} tokens/s "
                    f"({time.perf_counter() - t0:.0f} s)"
                )
            bar.update(1)
            if self.stop_for is not None:  # before this step's evaluation: save, then stop
                self._stop(bar)
            if tc.eval_every and self.step % tc.eval_every == 0 and self.step < end:
                t = time.perf_counter()
                ev = self.evaluate()
                if timed is not None:
                    timed.evaluated(time.perf_counter() - t, tc.eval_every, self.step)
                if ev:
                    self.log.log(self.step, "eval", ev)
            if tc.save_every and self.step % tc.save_every == 0 and self.step < end:
                self.save()
            if timed is not None:
                horizon = timed.observe(self.step, time.perf_counter() - t0)
                if horizon is not None:
                    self._plan(horizon, timed, bar)
                if timed.done:
                    timed = None
            if self.step < self.schedule.horizon and self._out_of_time(t0):
                self.acc.print(
                    f"[distill] trainer.max_seconds={tc.max_seconds:g} reached after step "
                    f"{self.step} of {self.schedule.horizon}: stopping early (the learning-rate "
                    "schedule was planned for that many steps; resume=true continues the run)"
                )
                break
        bar.close()
        final_eval = self.evaluate()
        if final_eval:
            self.log.log(self.step, "eval", final_eval)
        ckpt = self.save()
        self.acc.print(f"[distill] {self.step} steps in {time.perf_counter() - t0:.1f}s")
        self.log.close()
        if self.signals.received is not None:  # during the final evaluation or save: no export
            raise RunStopped(self.signals.received, self.step, ckpt)
        return RunResult(self.step, last, final_eval, eval_initial)
