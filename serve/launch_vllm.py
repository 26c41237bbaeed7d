"""The vLLM branch of `serve.launch`: every decision behind the `vllm serve` command, with the
notes that explain it. Pure: `serve.launch` prints the notes and execs the command (vLLM then owns
the process: signals, its own logging).

The checkpoint was validated once by the launch; here only what vLLM adds: its Markov head types,
its version's features (`common.spec_config.fit_to_vllm` drops what an older one lacks), the flags
it would reject (`serve.vllm_args`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from common.checkpoint import WEIGHTS_NAME
from common.config import DSparkConfig
from common.sampling.calibration import folded_temperature
from common.spec_config import (
    NEWEST_VLLM,
    fit_to_vllm,
    has_feature,
    missing_features,
    speculative_config,
)
from serve.launch_config import (
    EMBEDDED_ONLY_KEYS,
    ServeCfg,
    changed_keys,
    decide_adaptive_verification,
    resolve_num_speculative_tokens,
)
from serve.vllm_args import (
    build_vllm_command,
    check_draft_tp,
    check_extra_args,
    check_markov_head,
    decide_batch_sharded_sampling,
    decide_cudagraph_capture_size,
)

# vLLM 0.34 (vllm/envs.py): the KV context, in tokens (default 8192, clamped to max_model_len
# minus the query), that every dummy request of adaptive verification's start-up cost profile
# carries. Its profile runs T tokens as T requests of one token, so each verified token is priced
# with a whole request's context read, although a verify adds draft tokens to the same requests
# (their KV is read once whatever their query length). 0 profiles without fabricated context:
# the table then grows with the tokens' own compute, which is what a draft adds.
PROFILE_CONTEXT_ENV = "VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN"
PROFILE_CONTEXT_TOKENS = 0

SEQUENTIAL_SAMPLING_LOG = "DSpark sequential sampling stays replicated across TP ranks"


def vllm_feature_lines(vllm_version: str | None) -> list[str]:
    """One line per seed feature the installed vLLM lacks, with what runs instead."""
    if vllm_version is None:
        newest = ".".join(map(str, NEWEST_VLLM))
        return [f"vLLM is not installed: the command is written for vLLM {newest}"]
    return [
        f"vLLM {vllm_version} lacks {f.what} (since {'.'.join(map(str, f.since))}): {f.without}"
        for f in missing_features(vllm_version)
    ]


def vllm_spec(
    cfg: ServeCfg, draft: DSparkConfig, vllm_version: str | None
) -> tuple[dict, list[str]]:
    """The speculative config for this launch and installed vLLM, with the notes behind it."""
    check_markov_head(draft)
    n, notes = resolve_num_speculative_tokens(cfg.num_speculative_tokens, draft)
    weights = Path(cfg.checkpoint) / WEIGHTS_NAME if cfg.checkpoint else None
    adaptive, msgs = decide_adaptive_verification(
        cfg.adaptive_verification,
        draft,
        enforce_eager=cfg.enforce_eager,
        vllm_version=vllm_version,
        calibrated=folded_temperature(weights) is not None
        if weights is not None and weights.is_file()
        else None,
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


def vllm_launch(
    cfg: ServeCfg, draft: DSparkConfig | None, vllm_version: str | None
) -> tuple[list[str], list[str]]:
    """-> (`vllm serve` argv, notes); `LaunchRefused` for a launch vLLM would reject."""
    check_extra_args(cfg.extra_vllm_args)
    check_draft_tp(cfg.tensor_parallel_size, cfg.draft_tensor_parallel_size)
    notes = vllm_feature_lines(vllm_version)
    spec = None
    if draft is not None:
        spec, msgs = vllm_spec(cfg, draft, vllm_version)
        notes += msgs
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
    capture, msgs = decide_cudagraph_capture_size(
        cfg.max_num_seqs,
        spec["num_speculative_tokens"] if spec else None,
        enforce_eager=cfg.enforce_eager,
        extra_args=cfg.extra_vllm_args,
    )
    notes += msgs
    cmd = build_vllm_command(
        cfg,
        spec,
        batch_sharded=sharded,
        cudagraph_capture_size=capture,
        per_request_metrics=has_feature(vllm_version, "per_request_spec_decode_metrics"),
    )
    return cmd, notes


def vllm_env(cmd: list[str], environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Environment variables the `vllm serve` command `cmd` should run with, beyond `environ`, and
    the notes that say why. With adaptive verification on: `PROFILE_CONTEXT_ENV`, unless
    `environ` sets it (the user's value is kept)."""
    spec = {}
    if "--speculative-config" in cmd:
        spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    if not spec.get("enable_adaptive_verification"):
        return {}, []
    if PROFILE_CONTEXT_ENV in environ:
        return {}, [
            f"adaptive verification: cost profile context {environ[PROFILE_CONTEXT_ENV]} tokens "
            f"({PROFILE_CONTEXT_ENV} as set)"
        ]
    return {PROFILE_CONTEXT_ENV: str(PROFILE_CONTEXT_TOKENS)}, [
        f"adaptive verification: {PROFILE_CONTEXT_ENV}={PROFILE_CONTEXT_TOKENS} (vLLM 0.34 "
        "profiles each verified token with a whole request's context, 8192 tokens by default, and "
        "then cuts drafts that would pay; export it to override)"
    ]
