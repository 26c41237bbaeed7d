"""`python -m serve.launch [key=value ...]`: serve a target with its DSpark draft.

Config: configs/serve/serve.yaml (schema `ServeCfg`), Hydra overrides on the command line;
`dry_run=true` prints every decision and the command, then exits. Exit code 2 for a bad
key/value, a missing target/checkpoint, or a launch vLLM would reject (the message says what to
change).

Design choices:
- One file per job: `launch_config` (schema, overrides, paths), `launch_vllm` (decisions in
  `vllm_args`, then exec of `vllm serve`), `launch_embedded` (this repo's engine),
  `launch_report` (what is printed), `launch_probes` (the machine). This file reads the draft's
  config, picks the engine and hands over.
- `engine=auto` takes vLLM only when a supported vLLM (vllm>=0.26,<0.35) is installed, a CUDA
  GPU is there and stock vLLM can serve the draft's Markov head; otherwise the embedded engine,
  saying why. An older vLLM runs without the seed features it lacks, and the launch says which.
- serve/ never imports train/: checkpoints are read through common/.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from functools import cache
from pathlib import Path

from common.checkpoint import read_config
from common.config import ConfigError, DSparkConfig
from common.spec_config import PINNED_VLLM, vllm_supported
from serve import launch_probes as probes
from serve.launch_config import LaunchRefused, ServeCfg, check_paths, compose_serve_config
from serve.launch_embedded import launch_embedded
from serve.launch_report import say
from serve.launch_vllm import launch_vllm


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
    if not vllm_supported(vllm_version):
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


def read_draft(cfg: ServeCfg) -> DSparkConfig | None:
    if cfg.checkpoint is None:
        return None
    try:
        return read_config(cfg.checkpoint)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LaunchRefused(f"checkpoint={cfg.checkpoint}: cannot read its config: {e}") from None


def refuse_unfit_draft(cfg: ServeCfg) -> None:
    """The draft must fit the (local) target, field by field (common.target_fit)."""
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
    draft = read_draft(cfg)
    refuse_unfit_draft(cfg)  # before any engine is chosen or started
    vllm_version = probes.probe_vllm_version()
    gpus = cache(probes.probe_cuda_devices)
    needs_gpus = (cfg.engine == "auto" and vllm_supported(vllm_version)) or (
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
        print("Keys and defaults (configs/serve/serve.yaml):")
        print("\n".join(f"  {k}={v!r}" for k, v in asdict(ServeCfg()).items()))
        return 0
    try:
        return launch(argv)
    except (LaunchRefused, ConfigError) as e:
        print(f"serve.launch: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
