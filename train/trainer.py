"""The distillation loop: frozen target -> captured layers + teacher -> draft loss -> AdamW.

One optimizer step = `grad_accum` micro-batches per rank. Their anchors and loss denominators are
computed first and summed over micro-batches and ranks, so each micro-batch backprops
`num_local / den_global` (x world size, undoing DDP's gradient averaging): the global (num, den)
ratio, divided last, independent of how the batch is split.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from common.model import DSparkDraftModel
from common.target import TargetCapture, target_head_weights
from train.blocks import anchor_blocks, capture_batch
from train.data import build_dataloader
from train.loss import summarize
from train.metrics import RunLogger
from train.objective import DistillObjective
from train.state import latest_checkpoint, load_checkpoint_state, save_checkpoint_state


@dataclass
class RunResult:
    step: int
    train: dict
    eval: dict | None
    eval_initial: dict | None


def lr_lambda(ocfg, max_steps: int):
    warmup = max(1, round(ocfg.warmup_ratio * max_steps))

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, max_steps - warmup)
        return ocfg.min_lr_ratio + (1 - ocfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return f


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
        self.capture = TargetCapture(target, draft.config.target_layer_ids, check_finite=True)
        self.teacher_head = target_head_weights(target)[1]
        objective = DistillObjective(draft, cfg.loss)
        params = [p for p in objective.parameters() if p.requires_grad]
        o = cfg.optim
        opt = torch.optim.AdamW(
            params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(o, tc.max_steps))
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
        )
        if len(self.loader) == 0:
            raise RuntimeError(
                f"training data gives no full batch of {tc.micro_batch_size} x {self.world} rows "
                "per rank: lower trainer.micro_batch_size or add data"
            )
        self.eval_ds = eval_ds
        self.step = 0
        self._iter = None
        ckpt = latest_checkpoint(output_dir) if cfg.resume else None
        if ckpt is not None:
            state = load_checkpoint_state(accelerator, ckpt, fingerprint)
            self.step = int(state["step"])
            self.loader.load_state_dict(state["loader"])
            accelerator.print(f"[distill] resumed from {ckpt} at step {self.step}")
        self.log = RunLogger(
            output_dir, cfg.logger, run_config, accelerator.is_main_process, self.step
        )

    # ------------------------------------------------------------------ data
    def _next_batch(self) -> dict[str, torch.Tensor]:
        while True:
            if self._iter is None:
                self._iter = iter(self.loader)
            batch = next(self._iter, None)
            if batch is not None:
                return {k: v.to(self.acc.device) for k, v in batch.items()}
            self._iter = None  # epoch finished; the loader advanced its epoch

    def _prepare(self, batch, step: int):
        cfg = self.cfg
        draft = self.acc.unwrap_model(self.objective).draft
        return anchor_blocks(
            batch, draft.config, draft.t2d, cfg.trainer.num_anchors, cfg.seed, step, cfg.loss.decay
        )

    def _reduce(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: self.acc.reduce(v.detach().float(), reduction="sum") for k, v in sums.items()}

    # ------------------------------------------------------------------ steps
    def train_step(self) -> dict:
        tc = self.cfg.trainer
        micro = []
        for _ in range(tc.grad_accum):
            batch = self._next_batch()
            micro.append((batch, *self._prepare(batch, self.step)))
        dens = {}
        for _, _, _, tg in micro:
            for k, v in tg.dens().items():
                dens[k] = dens.get(k, 0) + v
        dens = self._reduce(dens)
        totals: dict[str, torch.Tensor] = {}
        tokens = 0
        for i, (batch, anchors, valid, tg) in enumerate(micro):
            cap = capture_batch(self.capture, batch)
            sync = i == len(micro) - 1
            ctx = contextlib.nullcontext() if sync else self.acc.no_sync(self.objective)
            with ctx:
                loss, sums = self.objective(
                    cap.aux, cap.final, self.teacher_head, batch, anchors, valid, tg, dens
                )
                self.acc.backward(loss * self.world)
            for k, v in sums.items():
                totals[k] = totals.get(k, 0) + v
            tokens += batch["input_ids"].numel()
        grad_norm = self.acc.clip_grad_norm_(self.objective.parameters(), self.cfg.optim.clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        out = summarize(self._reduce(totals))
        out["loss"] = (
            self.cfg.loss.ce_weight * out["ce"]
            + self.cfg.loss.l1_weight * out["l1"]
            + self.cfg.loss.bce_weight * out.get("bce", 0.0)
        )
        out["grad_norm"] = float(grad_norm)
        out["lr"] = self.sched.get_last_lr()[0]
        out["tokens"] = tokens * self.world
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
        totals: dict[str, torch.Tensor] = {}
        self.objective.eval()
        for i, batch in enumerate(loader):
            if i >= cfg.trainer.eval_batches:
                break
            batch = {k: v.to(self.acc.device) for k, v in batch.items()}
            anchors, valid, tg = self._prepare(batch, -1)  # fixed anchors for every eval
            cap = capture_batch(self.capture, batch)
            dens = self._reduce(tg.dens())
            _, sums = self.objective(
                cap.aux, cap.final, self.teacher_head, batch, anchors, valid, tg, dens
            )
            for k, v in sums.items():
                totals[k] = totals.get(k, 0) + v
        self.objective.train()
        return summarize(self._reduce(totals)) if totals else None

    def save(self) -> None:
        state = {"loader": self.loader.state_dict(), "fingerprint": self.fingerprint}
        save_checkpoint_state(
            self.acc, self.output_dir, self.step, state, self.cfg.trainer.keep_last
        )

    def fit(self) -> RunResult:
        tc = self.cfg.trainer
        main = self.acc.is_main_process
        eval_initial = None
        if self.step == 0:
            eval_initial = self.evaluate()
            if eval_initial:
                self.log.log(0, "eval", eval_initial)
        bar = tqdm(
            total=tc.max_steps,
            initial=self.step,
            disable=not (main and tc.progress),
            desc="distill",
            dynamic_ncols=True,
        )
        last, t0 = {}, time.perf_counter()
        while self.step < tc.max_steps:
            t = time.perf_counter()
            last = self.train_step()
            self.step += 1
            last["tokens_per_s"] = last["tokens"] / (time.perf_counter() - t)
            if self.step % tc.log_every == 0 or self.step == tc.max_steps:
                self.log.log(self.step, "train", last)
            bar.set_postfix(loss=f"{last['loss']:.3f}", tau=f"{last['analytic_tau']:.2f}")
            bar.update(1)
            if tc.eval_every and self.step % tc.eval_every == 0 and self.step < tc.max_steps:
                ev = self.evaluate()
                if ev:
                    self.log.log(self.step, "eval", ev)
            if tc.save_every and self.step % tc.save_every == 0 and self.step < tc.max_steps:
                self.save()
            if tc.step_delay_s:
                time.sleep(tc.step_delay_s)
        bar.close()
        final_eval = self.evaluate()
        if final_eval:
            self.log.log(self.step, "eval", final_eval)
        self.save()
        self.acc.print(f"[distill] {self.step} steps in {time.perf_counter() - t0:.1f}s")
        self.log.close()
        return RunResult(self.step, last, final_eval, eval_initial)
