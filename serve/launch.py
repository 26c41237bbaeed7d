"""`python -m serve.launch [key=value ...]`: serve a target with its DSpark draft.

Config: configs/serve.yaml (schema `ServeCfg`), Hydra overrides on the command line; `dry_run=true`
prints every decision and the command, then exits. Exit code 2 for a bad key/value, a missing
target/checkpoint, or a launch vLLM would reject (the message says what to change).

Design choices:
- Hydra's override grammar on configs/serve.yaml, applied by us (not `@hydra.main`): no outputs/
  folder or chdir per launch, and the error messages and exit codes are ours.
- `engine=auto` takes vLLM only when vllm>=0.34,<0.35 is installed and a CUDA GPU is there (and a
  stock vLLM can serve the draft's Markov head); otherwise the embedded engine, saying why.
- The vLLM branch is `serve.vllm_args` (pure decisions + argv builder) then `os.execvp`, so vLLM
  owns the process (signals, its own logging). The embedded branch imports its engine lazily.
- serve/ never imports train/: checkpoints are read through common/.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from common.checkpoint import read_config
from common.config import ConfigError, DSparkConfig
from common.contract import check_checkpoint
from serve.vllm_args import (
    PINNED_VLLM,
    LaunchRefused,
    ShardingInputs,
    VllmServeArgs,
    build_vllm_command,
    check_draft_tp,
    check_extra_args,
    check_markov_head,
    decide_adaptive_verification,
    decide_batch_sharded_sampling,
    format_sampling_plan,
    pynccl_disabled,
    resolve_num_speculative_tokens,
    sequential_sampling_reasons,
    target_has_compute_logits_local,
    vllm_version_ok,
)
from serve.watchdog import spawn_sidecar

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
TRAIN_COMMAND = "python -m train.distill +experiment=tiny"
ENGINES = ("auto", "vllm", "embedded")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass
class ServeCfg:
    """Schema of configs/serve.yaml (comments there)."""

    target: str = "artifacts/tiny-target"
    checkpoint: str | None = "outputs/tiny/final"
    engine: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    num_speculative_tokens: int | None = None
    draft_sampling: str = "probabilistic"
    adaptive_verification: bool = False
    tensor_parallel_size: int = 1
    draft_tensor_parallel_size: int | None = None
    batch_sharded_sampling: Any = "auto"
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    max_logprobs: int | None = None
    enforce_eager: bool = False
    attention_backend: str | None = None
    dtype: str | None = None
    seed: int | None = None
    extra_vllm_args: list[str] = field(default_factory=list)
    device: str = "auto"
    sps_table: str | None = None
    dry_run: bool = False

    def __post_init__(self):
        def need(ok: bool, msg: str):
            if not ok:
                raise LaunchRefused(msg)

        need(self.engine in ENGINES, f"engine={self.engine!r}: choose one of {list(ENGINES)}.")
        need(
            self.draft_sampling in ("greedy", "probabilistic"),
            f"draft_sampling={self.draft_sampling!r}: choose greedy or probabilistic.",
        )
        need(
            self.batch_sharded_sampling in ("auto", True, False),
            f"batch_sharded_sampling={self.batch_sharded_sampling!r}: choose auto, true or false.",
        )
        need(bool(self.target), "target is empty: give the target model folder or hub id.")
        need(0 < self.port < 65536, f"port={self.port}: must be in 1..65535.")
        need(self.tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1.")
        for key in ("num_speculative_tokens", "draft_tensor_parallel_size", "max_num_seqs"):
            value = getattr(self, key)
            need(value is None or value >= 1, f"{key}={value}: must be >= 1 or null.")
        need(
            self.max_model_len is None or self.max_model_len >= 2,
            f"max_model_len={self.max_model_len}: must be >= 2 or null.",
        )
        need(
            self.max_logprobs is None or self.max_logprobs >= -1,
            f"max_logprobs={self.max_logprobs}: must be >= -1 or null.",
        )


def compose_serve_config(overrides: list[str]) -> ServeCfg:
    """configs/serve.yaml + overrides -> a validated ServeCfg; `LaunchRefused` names the key.

    Overrides use Hydra's grammar (`key=value`, `key=null`, `key=[a,b]`) but are applied here, not
    by `hydra.compose`: configs/ also holds the trainer's groups, one of them named `target`, so
    compose would read `target=DIR` as a group choice."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    keys = [f.name for f in dataclasses.fields(ServeCfg)]
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise LaunchRefused("bad override: " + _one_line(e)) from None
    raw = OmegaConf.load(CONFIG_DIR / "serve.yaml")
    for o in parsed:
        key = o.key_or_group
        if key not in keys:
            raise LaunchRefused(f"unknown key {key!r} in {o.input_line!r}; keys: {', '.join(keys)}")
        if o.is_delete() or o.is_add() or o.is_sweep_override():
            raise LaunchRefused(f"{o.input_line!r}: the serve config takes plain {key}=VALUE")
        raw[key] = o.value()
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(ServeCfg), raw)
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        if isinstance(e.__cause__, LaunchRefused):
            raise e.__cause__ from None
        raise LaunchRefused("bad config: " + _one_line(e)) from None


def _one_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return "; ".join(lines)[:600]


# ---------------------------------------------------------------- pure decisions


def check_paths(cfg: ServeCfg) -> list[str]:
    """Refuse a missing target/checkpoint (naming the command that makes the defaults); returns
    notes (a target that is not local is passed on as a hub id)."""
    defaults = ServeCfg()
    missing_defaults = []
    notes = []
    for key in ("target", "checkpoint"):
        value = getattr(cfg, key)
        if value is None or Path(value).exists():
            continue
        if value == getattr(defaults, key):
            missing_defaults.append(f"{key}={value}")
        elif key == "target" and HUB_ID.fullmatch(value):
            notes.append(f"target {value} is not a local folder: passed on as a Hugging Face id")
        else:
            raise LaunchRefused(f"{key}={value}: no such folder.")
    if missing_defaults:
        raise LaunchRefused(
            f"{' and '.join(missing_defaults)} not found: the default target and draft are made "
            f"by `{TRAIN_COMMAND}` (the README's main job). Run it first, or pass "
            "target=... checkpoint=... ."
        )
    if cfg.checkpoint is not None and not Path(cfg.checkpoint).is_dir():
        raise LaunchRefused(f"checkpoint={cfg.checkpoint}: not a folder.")
    return notes


def choose_engine(
    requested: str,
    *,
    vllm_version: str | None,
    num_gpus: int,
    tensor_parallel_size: int = 1,
    markov_head_type: str | None = "vanilla",
) -> tuple[str, str]:
    """-> (engine, why). `auto` takes vLLM only when it can serve this launch."""
    if requested != "auto":
        return requested, f"engine={requested}"
    if vllm_version is None:
        return "embedded", "vLLM is not installed"
    if not vllm_version_ok(vllm_version):
        return "embedded", f"vLLM {vllm_version} is installed; DSpark serving needs {PINNED_VLLM}"
    if num_gpus == 0:
        return "embedded", "no CUDA GPU"
    if num_gpus < tensor_parallel_size:
        return "embedded", (
            f"tensor_parallel_size={tensor_parallel_size} needs {tensor_parallel_size} GPUs, "
            f"found {num_gpus}"
        )
    if markov_head_type not in (None, "vanilla"):
        return "embedded", f"markov_head_type={markov_head_type!r}: stock vLLM serves only vanilla"
    return "vllm", f"vLLM {vllm_version} and {num_gpus} CUDA GPU(s)"


def embedded_options(cfg: ServeCfg, draft: DSparkConfig | None, num_gpus: int) -> dict[str, Any]:
    """EngineOptions kwargs (None = the engine's default, left out)."""
    n, adaptive = None, False
    if draft is not None:
        n, _ = resolve_num_speculative_tokens(cfg.num_speculative_tokens, draft)
        adaptive, _ = decide_adaptive_verification(cfg.adaptive_verification, draft)
    device = cfg.device if cfg.device != "auto" else ("cuda" if num_gpus > 0 else "cpu")
    kwargs = dict(
        target=cfg.target,
        checkpoint=cfg.checkpoint,
        device=device,
        dtype=cfg.dtype,
        num_speculative_tokens=n,
        draft_sampling=cfg.draft_sampling,
        adaptive_verification=adaptive,
        sps_table=cfg.sps_table,
        max_num_seqs=cfg.max_num_seqs,
        max_model_len=cfg.max_model_len,
        seed=cfg.seed,
    )
    keep = {"target", "checkpoint"}
    return {k: v for k, v in kwargs.items() if v is not None or k in keep}


# ---------------------------------------------------------------- machine probes (patched in tests)


def probe_vllm_version() -> str | None:
    """The installed vLLM's version without importing it (None if absent)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "unknown"


def probe_cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def target_architectures(target: str) -> list[str] | None:
    path = Path(target) / "config.json"
    if not path.is_file():
        return None
    import json

    return json.loads(path.read_text()).get("architectures")


def exec_command(cmd: list[str]) -> None:
    os.execvp(cmd[0], cmd)


# ---------------------------------------------------------------- branches


def say(msg: str) -> None:
    print(f"serve.launch: {msg}", flush=True)


def launch_vllm(cfg: ServeCfg, draft: DSparkConfig | None, vllm_version: str | None) -> int:
    extra = tuple(cfg.extra_vllm_args)
    check_extra_args(extra)
    check_draft_tp(cfg.tensor_parallel_size, cfg.draft_tensor_parallel_size)
    n, adaptive, notes = None, False, []
    if draft is not None:
        check_markov_head(draft)
        problems = check_checkpoint(cfg.checkpoint, require_vllm_servable=True)
        if problems:
            raise LaunchRefused(
                f"checkpoint {cfg.checkpoint} fails the vLLM contract "
                f"(python -m serve.check {cfg.checkpoint} --vllm):\n  " + "\n  ".join(problems)
            )
        n, msgs = resolve_num_speculative_tokens(cfg.num_speculative_tokens, draft)
        notes += msgs
        adaptive, msgs = decide_adaptive_verification(
            cfg.adaptive_verification, draft, enforce_eager=cfg.enforce_eager, extra_args=extra
        )
        notes += msgs
    else:
        notes.append("checkpoint=null: serving the target alone (no speculative decoding)")
        if cfg.adaptive_verification:
            notes.append("warning: adaptive_verification ignored without a checkpoint")
    sharded, msgs = decide_batch_sharded_sampling(
        cfg.batch_sharded_sampling,
        cfg.tensor_parallel_size,
        cfg.max_num_seqs,
        cfg.max_logprobs,
        extra,
    )
    notes += msgs
    args = VllmServeArgs(
        target=cfg.target,
        checkpoint=cfg.checkpoint,
        num_speculative_tokens=n,
        draft_sample_method=cfg.draft_sampling,
        enable_adaptive_verification=adaptive,
        attention_backend=cfg.attention_backend,
        tensor_parallel_size=cfg.tensor_parallel_size,
        draft_tensor_parallel_size=cfg.draft_tensor_parallel_size,
        enable_batch_sharded_sampling=sharded,
        host=cfg.host,
        port=cfg.port,
        served_model_name=cfg.served_model_name,
        max_num_seqs=cfg.max_num_seqs,
        max_model_len=cfg.max_model_len,
        max_logprobs=cfg.max_logprobs,
        enforce_eager=cfg.enforce_eager,
        dtype=cfg.dtype,
        seed=cfg.seed,
        extra_args=extra,
    )
    cmd = build_vllm_command(args)
    for note in notes:
        say(note)
    if draft is not None:
        plan = sequential_sampling_reasons(
            ShardingInputs(
                tensor_parallel_size=cfg.tensor_parallel_size,
                batch_sharded_sampling=sharded,
                draft_sample_method=cfg.draft_sampling,
                enable_adaptive_verification=adaptive,
                has_confidence_head=draft.enable_confidence_head,
                dspark_draft_topk=draft.dspark_draft_topk,
                target_has_compute_logits_local=target_has_compute_logits_local(
                    target_architectures(cfg.target)
                ),
                draft_tensor_parallel_size=cfg.draft_tensor_parallel_size,
                pynccl_disabled=pynccl_disabled(os.environ),
            )
        )
        for line in format_sampling_plan(plan):
            say(line)
    say("command: " + shlex.join(cmd))
    if cfg.dry_run:
        return 0
    if not vllm_version_ok(vllm_version):
        found = "not installed" if vllm_version is None else f"version {vllm_version}"
        raise LaunchRefused(
            f"engine=vllm but vLLM is {found}: install {PINNED_VLLM} "
            "(pip install -e '.[serve]') or use engine=embedded."
        )
    if shutil.which("vllm") is None:
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", *cmd[1:]]
    if spawn_sidecar(cfg.host, cfg.port, cfg.checkpoint) is not None:
        say("acceptance watchdog: sidecar polling /metrics (python -m serve.watchdog)")
    exec_command(cmd)
    return 0  # not reached: exec replaces this process


def launch_embedded(cfg: ServeCfg, draft: DSparkConfig | None, num_gpus: int) -> int:
    if draft is not None:
        problems = check_checkpoint(cfg.checkpoint)
        if problems:
            raise LaunchRefused(
                f"checkpoint {cfg.checkpoint} is not a valid DSpark draft:\n  "
                + "\n  ".join(problems)
            )
        for msg in resolve_num_speculative_tokens(cfg.num_speculative_tokens, draft)[1]:
            say(msg)
        for msg in decide_adaptive_verification(cfg.adaptive_verification, draft)[1]:
            say(msg)
    else:
        say("checkpoint=null: serving the target alone (no speculative decoding)")
        if cfg.adaptive_verification:
            say("warning: adaptive_verification ignored without a checkpoint")
    defaults = ServeCfg()
    ignored = [
        k
        for k in (
            "tensor_parallel_size",
            "draft_tensor_parallel_size",
            "batch_sharded_sampling",
            "max_logprobs",
            "enforce_eager",
            "attention_backend",
            "extra_vllm_args",
        )
        if getattr(cfg, k) != getattr(defaults, k)
    ]
    if ignored:
        say(f"warning: the embedded engine ignores vLLM-only settings: {', '.join(ignored)}")
    kwargs = embedded_options(cfg, draft, num_gpus)
    say("EngineOptions(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")")
    say(
        f"run_server(opts, host={cfg.host!r}, port={cfg.port}, "
        f"served_model_name={cfg.served_model_name!r})"
    )
    if cfg.dry_run:
        return 0
    try:
        from serve.api.server import run_server
        from serve.engine.options import EngineOptions
    except ImportError as e:
        raise LaunchRefused(f"the embedded engine is not available here: {e}") from None
    try:
        opts = EngineOptions(**kwargs)
    except ValueError as e:
        raise LaunchRefused(f"embedded engine options: {e}") from None
    run_server(opts, cfg.host, cfg.port, served_model_name=cfg.served_model_name)
    return 0


def refuse_unfit_draft(cfg: ServeCfg) -> None:
    """Before either engine starts: the draft must fit the (local) target, field by field."""
    if cfg.checkpoint is None or not Path(cfg.target).is_dir():
        return
    from common.target_fit import checkpoint_fit_problems

    problems = checkpoint_fit_problems(cfg.checkpoint, cfg.target)
    if problems:
        raise LaunchRefused(
            f"checkpoint {cfg.checkpoint} does not fit target {cfg.target} (python -m serve.check "
            f"{cfg.checkpoint} --target {cfg.target}):\n  " + "\n  ".join(problems)
        )


def launch(overrides: list[str]) -> int:
    cfg = compose_serve_config(overrides)
    for note in check_paths(cfg):
        say(note)
    draft = None
    if cfg.checkpoint is not None:
        try:
            draft = read_config(cfg.checkpoint)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LaunchRefused(
                f"checkpoint={cfg.checkpoint}: cannot read its config: {e}"
            ) from None
    refuse_unfit_draft(cfg)
    vllm_version = probe_vllm_version()
    gpus = cache(probe_cuda_devices)
    needs_gpus = (cfg.engine == "auto" and vllm_version_ok(vllm_version)) or (
        cfg.engine != "vllm" and cfg.device == "auto"
    )
    engine, why = choose_engine(
        cfg.engine,
        vllm_version=vllm_version,
        num_gpus=gpus() if needs_gpus else 0,
        tensor_parallel_size=cfg.tensor_parallel_size,
        markov_head_type=draft.markov_head_type if draft else None,
    )
    say(f"engine: {engine} ({why})")
    if engine == "vllm":
        return launch_vllm(cfg, draft, vllm_version)
    return launch_embedded(cfg, draft, gpus() if cfg.device == "auto" else 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        print("Keys and defaults (configs/serve.yaml):")
        print("\n".join(f"  {k}={v!r}" for k, v in asdict(ServeCfg()).items()))
        return 0
    try:
        return launch(argv)
    except (LaunchRefused, ConfigError) as e:
        print(f"serve.launch: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
