"""The vLLM branch of `serve.launch`: decide, print, then exec `vllm serve` (vLLM owns the
process: signals, its own logging)."""

from __future__ import annotations

import shlex
import sys

from common.config import DSparkConfig
from common.contract import check_checkpoint
from common.spec_config import (
    PINNED_VLLM,
    fit_to_vllm,
    has_feature,
    speculative_config,
    vllm_supported,
)
from serve import launch_probes as probes
from serve.launch_config import LaunchRefused, ServeCfg, changed_keys
from serve.launch_report import baseline_notes, say, vllm_feature_lines
from serve.vllm_args import (
    EMBEDDED_ONLY_KEYS,
    build_vllm_command,
    check_draft_tp,
    check_extra_args,
    check_markov_head,
    decide_adaptive_verification,
    decide_batch_sharded_sampling,
    resolve_num_speculative_tokens,
)
from serve.watchdog import spawn_sidecar

SEQUENTIAL_SAMPLING_LOG = "DSpark sequential sampling stays replicated across TP ranks"


def vllm_spec(
    cfg: ServeCfg, draft: DSparkConfig, vllm_version: str | None
) -> tuple[dict, list[str]]:
    """The speculative config for this launch and installed vLLM, with the notes behind it."""
    check_markov_head(draft)
    problems = check_checkpoint(cfg.checkpoint, require_vllm_servable=True)
    if problems:
        raise LaunchRefused(
            f"checkpoint {cfg.checkpoint} fails the vLLM contract "
            f"(python -m serve.check {cfg.checkpoint} --vllm):\n  " + "\n  ".join(problems)
        )
    n, notes = resolve_num_speculative_tokens(cfg.num_speculative_tokens, draft)
    adaptive, msgs = decide_adaptive_verification(
        cfg.adaptive_verification,
        draft,
        enforce_eager=cfg.enforce_eager,
        vllm_version=vllm_version,
    )
    spec = speculative_config(
        draft,
        cfg.checkpoint,
        num_speculative_tokens=n,
        draft_sample_method=cfg.draft_sampling,
        adaptive_verification=adaptive,
        attention_backend=cfg.attention_backend,
        draft_tensor_parallel_size=cfg.draft_tensor_parallel_size,
    )
    spec, dropped = fit_to_vllm(spec, vllm_version)
    return spec, notes + msgs + dropped


def launch_vllm(cfg: ServeCfg, draft: DSparkConfig | None, vllm_version: str | None) -> int:
    check_extra_args(cfg.extra_vllm_args)
    check_draft_tp(cfg.tensor_parallel_size, cfg.draft_tensor_parallel_size)
    notes = vllm_feature_lines(vllm_version)
    spec = None
    if draft is not None:
        spec, msgs = vllm_spec(cfg, draft, vllm_version)
        notes += msgs
    else:
        notes += baseline_notes(cfg)
    sharded, msgs = decide_batch_sharded_sampling(
        cfg.batch_sharded_sampling,
        cfg.tensor_parallel_size,
        cfg.max_num_seqs,
        cfg.max_logprobs,
        vllm_version,
        adaptive_verification=bool(spec and spec.get("enable_adaptive_verification")),
    )
    notes += msgs
    if draft is not None and sharded and has_feature(vllm_version, "sharded_sequential_sampling"):
        notes.append(
            "DSpark sequential sampling: vLLM decides at load whether to batch-shard it; if "
            f"not, it logs '{SEQUENTIAL_SAMPLING_LOG}: <reason>'"
        )
    ignored = ", ".join(changed_keys(cfg, EMBEDDED_ONLY_KEYS))
    if ignored:
        notes.append(f"warning: the vLLM launch ignores embedded-engine settings: {ignored}")
    cmd = build_vllm_command(cfg, spec, batch_sharded=sharded)
    for note in notes:
        say(note)
    say("command: " + shlex.join(cmd))
    if cfg.dry_run:
        return 0
    if not vllm_supported(vllm_version):
        found = "not installed" if vllm_version is None else f"version {vllm_version}"
        raise LaunchRefused(
            f"engine=vllm but vLLM is {found}: install {PINNED_VLLM} "
            "(pip install -e '.[serve]') or use engine=embedded."
        )
    if probes.which("vllm") is None:
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", *cmd[1:]]
    if spawn_sidecar(cfg.host, cfg.port, cfg.checkpoint) is not None:
        say("acceptance watchdog: sidecar polling /metrics (python -m serve.watchdog)")
    probes.exec_command(cmd)
    return 0  # not reached: exec replaces this process
