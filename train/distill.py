"""`python -m train.distill +experiment=NAME [key=value ...]`: distill a DSpark draft.

Steps: compose + validate the config (exit 2 on a bad key) -> check the output dir -> load the
frozen target -> build data (and the reduced vocab map) -> draft from the target -> train with
accelerate (resumable checkpoints) -> export OUTPUT/final in vLLM's format -> print metrics.
`dry_run=true` stops before training: one held-out evaluation, then the draft as it starts goes to
OUTPUT/dry_run/final (the same export and contract check), so serving can be checked first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from omegaconf import OmegaConf

from common.checkpoint_errors import CheckpointFileError, check_model_folder
from common.config import ConfigError
from common.model import DSparkDraftModel
from common.target import target_head_weights
from train.config_io import BadConfig, compose_config, usage
from train.data.splits import build_splits
from train.errors import SetupError
from train.init.draft_config import draft_config, mask_token_for
from train.init.layer_init import copy_target_layers
from train.init.markov_init import markov_rows_from_embedding
from train.init.vocab_map import vocab_map_for
from train.init.warm_start import warm_start, warmup_note
from train.loop.compile_cache import load_compile_cache, save_compile_cache
from train.loop.objective import init_draft_weights
from train.loop.state import latest_checkpoint
from train.loop.stop_signals import RunStopped
from train.loop.target import apply_speed_settings, load_target
from train.loop.trainer import RunResult, Trainer
from train.prepare.regenerate import REGENERATED_NAME, regenerate_train_rows
from train.publish.export import export_final


def check_output_dir(cfg) -> Path:
    out = Path(cfg.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # one probe per process: the ranks of a multi-GPU run share output_dir (one name races)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise SetupError(
            f"output_dir {out} is not writable ({e}): choose another output_dir"
        ) from e
    found = latest_checkpoint(out)
    if cfg.resume == "auto":
        cfg.resume = found is not None
        print(
            f"[distill] resume=auto: continuing {found}"
            if found
            else f"[distill] resume=auto: no checkpoint in {out / 'checkpoints'}, starting afresh"
        )
    if cfg.resume and found is None:
        raise SetupError(
            f"resume=true but {out / 'checkpoints'} holds no checkpoint to continue: leave resume "
            "out to start a run there, or pass resume=auto (continues if there is one, else starts)"
        )
    if found is not None and not cfg.resume and not cfg.overwrite:
        raise SetupError(
            f"{out} already holds checkpoints of a run: pass resume=true to continue it, or "
            "overwrite=true to start afresh (or choose another output_dir / experiment_name)"
        )
    return out


def make_accelerator(tcfg) -> Accelerator:
    kwargs = {}
    if tcfg.distributed == "fsdp" and tcfg.anchor_sampling == "walk":
        # the walk's pass runs the unwrapped draft, whose parameters FSDP holds sharded
        raise SetupError(
            "trainer.anchor_sampling=walk runs with trainer.distributed=none or ddp, not fsdp"
        )
    if tcfg.distributed == "fsdp":
        from accelerate import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["DraftLayer"],
            use_orig_params=True,
        )
    cpu = tcfg.device == "cpu" or (tcfg.device == "auto" and not torch.cuda.is_available())
    if tcfg.device == "cuda" and not torch.cuda.is_available():
        raise SetupError("trainer.device=cuda but no CUDA GPU is visible: use trainer=cpu")
    return Accelerator(cpu=cpu, mixed_precision=tcfg.mixed_precision, **kwargs)


def run(cfg) -> dict:
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.seed)
    out = check_output_dir(cfg)
    acc = make_accelerator(cfg.trainer)
    if Path(cfg.target.path).is_dir():  # what is missing or truncated, before transformers fails
        check_model_folder(cfg.target.path, "target")
    target, tok = load_target(cfg.target, acc.device)
    train_path = cfg.data.train
    if cfg.data.regenerate.enabled:
        if acc.is_main_process:
            regenerate_train_rows(cfg, target, tok, out)
        acc.wait_for_everyone()
        train_path = str(out / REGENERATED_NAME)
    train_ds, eval_ds = build_splits(cfg, train_path, tok)
    mask = mask_token_for(cfg.draft, target, tok, train_ds)  # checked against the training rows
    dcfg = draft_config(cfg.draft, target, tok, cfg.target.path, mask)
    vmap = vocab_map_for(dcfg, train_ds, out / "vocab_map.pt")
    draft = DSparkDraftModel(dcfg)
    init_draft_weights(draft)
    embed, head = target_head_weights(target)
    draft.init_from_target(
        embed.float(), head.float(), *((vmap.d2t, vmap.t2d) if vmap is not None else ())
    )
    if cfg.init_layers_from_target is not None:
        if cfg.init_from:
            raise SetupError(
                "init_from and init_layers_from_target both set: init_from replaces "
                "every draft weight, so the layer copy would be lost; keep one"
            )
        layer_init = copy_target_layers(draft, target, cfg.init_layers_from_target)
        acc.print(
            f"[distill] draft layers from target layers {layer_init['target_layers']}: "
            f"copied {', '.join(layer_init['copied'])}; fresh: "
            f"{', '.join(layer_init['kept_fresh']) or 'none'}"
        )
    if cfg.init_markov_from_embedding:
        if cfg.init_from or draft.markov_head is None:
            raise SetupError(
                "init_markov_from_embedding needs a Markov head (draft.markov_rank > 0) and no "
                "init_from (which replaces every draft weight)"
            )
        share = markov_rows_from_embedding(draft, embed.float())
        acc.print(
            f"[distill] Markov head rows from the target embedding's principal directions "
            f"({share:.1%} of its variance)"
        )
    init_from = None
    if cfg.init_from:
        init_from = warm_start(draft, cfg.init_from, embed, head, cfg.init_from_vocab)
    if init_from and init_from["vocab"] == "rebuild":
        acc.print(
            f"[distill] init_from: the draft vocabulary rebuilt from this run's data, "
            f"{init_from['vocab_ids_kept']} ids kept, {init_from['vocab_ids_new']} new "
            "(their Markov rows start at zero)"
        )
    note = warmup_note(cfg.optim, cfg.trainer.max_steps) if init_from else None
    if note:
        acc.print(note)
    cache = cfg.trainer.get("compile_cache")
    if cache:  # before anything compiles
        acc.print(load_compile_cache(cache))
    apply_speed_settings(cfg.trainer, draft, target, acc.device)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    fingerprint = {
        **{f"draft.{k}": v for k, v in dcfg.to_hf_dict().items() if k != "target_name_or_path"},
        "seq_len": cfg.data.seq_len,
        "train_rows": len(train_ds),
        "seed": cfg.seed,
        "micro_batch_size": cfg.trainer.micro_batch_size,
        "grad_accum": cfg.trainer.grad_accum,
        "world_size": acc.num_processes,
        "max_steps": cfg.trainer.max_steps,
        "vocab_counts_hash": vmap.counts_hash if vmap else None,
        "init_from_weights_sha256": init_from and init_from["weights_sha256"],
    }
    trainer = Trainer(cfg, acc, target, draft, train_ds, eval_ds, out, fingerprint, resolved)
    if cfg.dry_run:
        evaluated = trainer.evaluate()
        trainer.log.close()  # a wandb run too: it ends here
        result = RunResult(trainer.step, {}, evaluated, evaluated)
    else:
        result = trainer.fit()
    if cache and acc.is_main_process:  # the final evaluation's compiles included
        print(save_compile_cache(cache))
    summary = {
        "step": result.step,
        "train": result.train,
        "eval": result.eval,
        "eval_untrained": result.eval_initial,
    }
    if acc.is_main_process:
        provenance = {
            "resolved_config": resolved,
            "vocab_counts_hash": fingerprint["vocab_counts_hash"],
            "mask_token": mask.as_dict(),
            "final_metrics": result.eval or result.train,
            "train_data": data_provenance(train_path),
            "init_from": init_from,
        }
        final = export_final(
            cfg,
            acc.unwrap_model(trainer.objective).draft,
            out / "dry_run" if cfg.dry_run else out,
            provenance,
            result,
        )
        if cfg.dry_run:
            print_dry_run(final, result, cfg.target.path)
        else:
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            start = "init_from draft" if init_from else "untrained draft"
            print_summary(summary, final, start=start)
    acc.wait_for_everyone()
    return summary


def data_provenance(path: str) -> dict:
    """The training file, and how it was made when the target regenerated it
    (`python -m train.prepare.regenerate` writes PATH.summary.json: rows, tokens, sampling,
    backend)."""
    summary = Path(path + ".summary.json")
    made = json.loads(summary.read_text()) if summary.is_file() else None
    return {"path": path, "regenerated": made}


def print_dry_run(final: Path, result, target: str) -> None:
    tau = f", held-out analytic tau {result.eval['analytic_tau']:.3f}" if result.eval else ""
    print(
        f"\n[distill] dry run: the draft at step {result.step}{tau}, exported to {final} and "
        "checked against vLLM's contract; nothing was trained. Before the real run, check it "
        f"against the target (python -m serve.check {final} --target {target} --vllm) and serve "
        f"it (python -m serve.launch target={target} checkpoint={final})"
    )


def print_summary(summary: dict, final: Path, start: str = "untrained draft") -> None:
    """The run's figures beside those at step 0 (`start` names that draft)."""
    ev, ev0 = summary["eval"] or summary["train"], summary["eval_untrained"]
    where = "held-out" if summary["eval"] else "last training step"
    print(f"\n[distill] final checkpoint: {final}")
    print(
        f"[distill] analytic tau ({where}): {ev['analytic_tau']:.3f}"
        + (f"  ({start}: {ev0['analytic_tau']:.3f})" if ev0 else "")
    )
    print(
        "[distill] per-position acceptance: "
        + " ".join(f"{a:.3f}" for a in ev["acceptance_per_pos"])
    )
    if ev0:
        print(
            f"[distill]   {start + ':':<20}"
            + " ".join(f"{a:.3f}" for a in ev0["acceptance_per_pos"])
        )
    if "greedy_tau" in ev:  # T=0: the draft's argmax is the teacher's, teacher-forced
        print(
            f"[distill] greedy (T=0) tau ({where}): {ev['greedy_tau']:.3f}, per position: "
            + " ".join(f"{a:.3f}" for a in ev["greedy_acceptance_per_pos"])
        )
    if "answer_head_analytic_tau" in ev:
        print(
            f"[distill] over each answer's first {ev['answer_head_tokens']} tokens: analytic tau "
            f"{ev['answer_head_analytic_tau']:.3f}, greedy tau {ev['answer_head_greedy_tau']:.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "help") for a in argv):
        print(usage())
        return 0
    if not argv:  # a bare command would start a 100-step run into outputs/default
        print(usage(), file=sys.stderr)
        return 2
    try:
        cfg = compose_config(argv)
    except BadConfig as e:
        print(f"[distill] bad config: {e}", file=sys.stderr)
        return 2
    if cfg.print_config:
        print(OmegaConf.to_yaml(cfg))
        return 0
    try:
        run(cfg)
    except RunStopped as e:
        print(f"[distill] {e}", file=sys.stderr)
        return e.exit_code
    except (SetupError, ConfigError, CheckpointFileError, FloatingPointError, *_data_errors()) as e:
        print(f"[distill] cannot start: {e}", file=sys.stderr)
        return 2
    return 0


def _data_errors() -> tuple[type[Exception], ...]:
    from train.data import BadRowError, ChatTemplateError

    return (BadRowError, ChatTemplateError)


if __name__ == "__main__":
    sys.exit(main())
