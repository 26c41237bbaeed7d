"""Typed schema of `configs/distill.yaml`. Hydra composes the YAML; merging into this structured
config rejects unknown keys and wrong types with the key's name (exit code 2 in `train.distill`).
Field comments are the documentation of each option."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from common.config import MARKOV_HEAD_TYPES, DSparkConfig

# DSparkConfig's defaults: the draft keys that are DSparkConfig fields take theirs from here, so
# the architecture's defaults live in one place (tests/integration/test_distill.py pins it).
_DSPARK = {f.name: f.default for f in dataclasses.fields(DSparkConfig)}


@dataclass
class TargetCfg:
    path: str = "artifacts/tiny-target"  # HF model folder or hub id (offline: a local folder)
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16
    build_tiny: bool = False  # build the embedded tiny target at `path` if it is missing
    # a cap on that build's training: it stops at its held-out loss target (tiny_target/presets.py)
    tiny_minutes: float = 60.0
    prepare: str | None = None  # train/prepare/target.py name: build it at `path` if missing
    trust_remote_code: bool = False


@dataclass
class DraftCfg:
    """The draft's architecture. Null sizes and layer ids are resolved from the target
    (train/init/draft_config.py); every other default that DSparkConfig has is DSparkConfig's."""

    num_hidden_layers: int = _DSPARK["num_hidden_layers"]
    hidden_size: int | None = None  # null: the target's (the draft shares its embedding)
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    block_size: int = _DSPARK["block_size"]
    markov_rank: int = _DSPARK["markov_rank"]  # 0 = DFlash
    markov_head_type: str = _DSPARK["markov_head_type"]  # vanilla | gated | rnn
    enable_confidence_head: bool = _DSPARK["enable_confidence_head"]
    confidence_head_with_markov: bool = _DSPARK["confidence_head_with_markov"]
    draft_vocab_size: int | None = _DSPARK["draft_vocab_size"]  # null = full target vocab
    # DSpark anchor-first (True) or DFlash 1+N (False)
    sample_from_anchor: bool = _DSPARK["sample_from_anchor"]
    dspark_draft_topk: int | None = _DSPARK["dspark_draft_topk"]
    target_layer_ids: list[int] | None = None  # null: 5 ids spread over 1..N-3
    # token for the mask slots; auto: chosen (train/init/mask_token.py)
    mask_token: str | None = "auto"
    mask_token_id: int | None = None  # explicit id (wins over mask_token)


@dataclass
class RegenerateCfg:
    enabled: bool = False
    backend: str = "auto"  # auto | hf | vllm
    temperature: float = 0.7
    top_p: float = 0.8
    max_new_tokens: int = 1024
    batch_size: int = 16


@dataclass
class DataCfg:
    train: str = "${target.path}/data/train.jsonl"
    heldout: str | None = "auto"  # TARGET/data/heldout.jsonl, else 2% of train (data/heldout.py)
    split: str | None = None
    max_rows: int | None = None
    heldout_max_rows: int | None = 256
    seq_len: int = 4096
    packing: str = "pack"  # pack | bucket
    chat_template: str | None = None  # .jinja overriding the tokenizer's (any template works)
    # options for the template: +data.chat_template_kwargs.enable_thinking=false
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    on_bad_row: str = "skip"  # skip: drop bad rows/turns, counted per reason | error: stop
    max_bad_row_share: float = 0.05  # a larger dropped share stops the run before training
    num_proc: int | None = None  # processes that tokenize (datasets' num_proc); null: one
    regenerate: RegenerateCfg = field(default_factory=RegenerateCfg)


@dataclass
class LossCfg:
    ce_weight: float = 0.1
    l1_weight: float = 0.9
    bce_weight: float = 1.0
    decay: float = 4.0  # w_k = exp(-k / decay)
    chunk_tokens: int = 1024  # rows of [*, vocab] logits alive at once
    confidence_detach: bool = True  # confidence head does not backprop into the backbone
    share_teacher: bool = True  # teacher logits once per position overlapping blocks share


@dataclass
class OptimCfg:
    lr: float = 6e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0
    clip: float = 1.0
    # cosine: warm-up, then cosine over the rest | wsd: warm-up, hold the peak, then a cosine over
    # the last decay_ratio of the steps after warm-up (train/loop/schedule.py)
    schedule: str = "cosine"
    decay_ratio: float = 0.2  # wsd only: share of the horizon after warm-up spent decaying, (0, 1]
    # the Markov head's learning rate as a multiple of lr (train/loop/optim_groups.py); > 0
    markov_lr_scale: float = 1.0
    # the Markov head's own AdamW weight decay (train/loop/optim_groups.py); None: weight_decay;
    # >= 0
    markov_weight_decay: float | None = None


@dataclass
class TrainerCfg:
    device: str = "auto"  # auto | cpu | cuda
    mixed_precision: str = "no"  # no | bf16 (autocast, fp32 master weights)
    distributed: str = "none"  # none | ddp | fsdp (launch with `accelerate launch`)
    micro_batch_size: int = 1  # sequences per rank per micro-step
    grad_accum: int = 1
    max_steps: int = 100
    max_seconds: float = 0.0  # stop (evaluate, save, export) once training ran this long; 0: off
    # With max_seconds: plan the learning-rate schedule (warm-up and decay) for the steps the
    # budget holds, measured after the first 22 steps (train/loop/schedule.py), so it ends where the
    # run does; false: plan it for max_steps and cut it wherever the time runs out.
    schedule_to_time: bool = True
    num_anchors: int = 512
    # uniform: anchors drawn at random among an answer's positions | walk: among those where the
    # current draft's greedy rounds start (train/loop/walk_anchors.py); evaluation is always uniform
    anchor_sampling: str = "uniform"
    eval_every: int = 0  # 0 = only at the end
    eval_batches: int = 8
    # Held-out figures also over each answer's first N tokens (answer_head_* metrics; 0: off): a
    # served request of N new tokens meets those, while whole answers of a small target loop.
    eval_answer_head: int = 256
    save_every: int = 0  # 0 = only at the end
    keep_last: int = 2
    log_every: int = 1
    num_workers: int = 0
    progress: bool = True
    print_every: int = 0  # a plain stdout line at step 1 and every N steps (0: none), for logs
    threads: int | None = None  # torch CPU threads (null: leave as is)
    max_bad_batches: int = 0  # non-finite loss/grad batches to skip (no step) before stopping
    # Speed (GPU only; train.loop.target.apply_speed_settings, measured by
    # scripts/bench_train_scale.py):
    draft_attention: str = "sdpa"  # the draft's block mask: sdpa (dense boolean) | flex (BlockMask)
    target_attention: str = "sdpa"  # the target's document-causal mask: sdpa | flex
    compile_draft: bool = False  # torch.compile each draft layer
    compile_target: bool = False  # torch.compile each target decoder layer (forward only)
    compile_loss: bool = False  # torch.compile the fused loss's [chunk, vocab] passes
    # torch.compile's artifacts: loaded before the first compile, written after the run
    # (train/loop/compile_cache.py); for machines that start empty, e.g. a file carried between
    # them.
    compile_cache: str | None = None


@dataclass
class LoggerCfg:
    backend: str = "none"  # none | wandb
    project: str = "dspark"
    entity: str | None = None
    mode: str = "offline"  # online | offline | disabled
    run_name: str | None = None


@dataclass
class ExportCfg:
    dtype: str = "bfloat16"
    # The draft shares the target's input embedding (and, with the full vocab, its lm_head):
    # loaders (vLLM, the embedded engine, speculators) take them from the target. true writes a
    # copy anyway (a self-contained folder, at V x H each).
    include_embed: bool = False
    include_lm_head: bool = False
    speculators: bool = True  # also write OUTPUT/final-speculators


@dataclass
class HubCfg:
    repo_id: str | None = None  # push OUTPUT/final here at the end
    private: bool = False


@dataclass
class DistillCfg:
    experiment_name: str = "default"
    output_dir: str = "outputs/${experiment_name}"
    seed: int = 0
    # false: a fresh run (refused where OUTPUT holds checkpoints, unless overwrite=true) | true:
    # continue OUTPUT's last checkpoint, an error where there is none | auto: continue if there is
    # one, else start afresh. Typed Any only because OmegaConf has no bool-or-string type;
    # train/config_io.py admits RESUME_CHOICES alone and turns true/false into booleans.
    resume: Any = False
    overwrite: bool = False  # allow a fresh run to replace OUTPUT's checkpoints
    # an exported draft (OUTPUT/final of a run) to start from instead of fresh weights; the
    # optimizer, schedule and data start afresh (train/init/warm_start.py)
    init_from: str | None = None
    # with init_from and a reduced draft vocabulary: "keep" the checkpoint's draft -> target map,
    # or "rebuild" it from this run's data (Markov rows of the ids in both maps carried over)
    init_from_vocab: str = "keep"
    # target layer ids the draft's decoder layers start from, one per draft layer (negative: from
    # the end); null: fresh weights (train/init/layer_init.py)
    init_layers_from_target: list[int] | None = None
    # the Markov head's previous-token rows from the target embedding's principal directions
    # instead of noise (train/init/markov_init.py)
    init_markov_from_embedding: bool = False
    print_config: bool = False
    # build everything, export the draft as it starts (untrained, or the checkpoint resume=true
    # picks) to OUTPUT/dry_run/final and stop: check serving before hours of training
    dry_run: bool = False
    target: TargetCfg = field(default_factory=TargetCfg)
    draft: DraftCfg = field(default_factory=DraftCfg)
    data: DataCfg = field(default_factory=DataCfg)
    loss: LossCfg = field(default_factory=LossCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    trainer: TrainerCfg = field(default_factory=TrainerCfg)
    logger: LoggerCfg = field(default_factory=LoggerCfg)
    export: ExportCfg = field(default_factory=ExportCfg)
    hub: HubCfg = field(default_factory=HubCfg)
    extra: dict[str, Any] = field(default_factory=dict)


RESUME_CHOICES = ("false", "true", "auto")

CHOICES = {
    "target.dtype": ("auto", "float32", "bfloat16", "float16"),
    "draft.markov_head_type": MARKOV_HEAD_TYPES,
    "data.packing": ("pack", "bucket"),
    "data.on_bad_row": ("skip", "error"),
    "data.regenerate.backend": ("auto", "hf", "vllm"),
    "optim.schedule": ("cosine", "wsd"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.mixed_precision": ("no", "bf16"),
    "trainer.distributed": ("none", "ddp", "fsdp"),
    "trainer.anchor_sampling": ("uniform", "walk"),
    "trainer.draft_attention": ("sdpa", "flex"),
    "trainer.target_attention": ("sdpa", "flex"),
    "logger.backend": ("none", "wandb"),
    "logger.mode": ("online", "offline", "disabled"),
    "export.dtype": ("bfloat16", "float16", "float32"),
}
