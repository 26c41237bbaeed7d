"""The embedded branch of `serve.launch`: `EngineOptions` from the serve config, then the
OpenAI-compatible server of this repo (imported only when it runs)."""

from __future__ import annotations

from typing import Any

from common.config import DSparkConfig
from common.contract import check_checkpoint
from serve.launch_config import LaunchRefused, ServeCfg, changed_keys
from serve.launch_report import baseline_notes, say
from serve.vllm_args import (
    VLLM_ONLY_KEYS,
    decide_adaptive_verification,
    resolve_num_speculative_tokens,
)

# ServeCfg keys that `EngineOptions` takes under the same name, as they are.
SHARED_KEYS = (
    "target",
    "checkpoint",
    "dtype",
    "draft_sampling",
    "adaptive_policy",
    "adaptive_budget_confidence",
    "cost_table",
    "sps_table",
    "use_fp64_gumbel",
    "max_num_seqs",
    "max_model_len",
    "seed",
)


def embedded_options(cfg: ServeCfg, draft: DSparkConfig | None, num_gpus: int) -> dict[str, Any]:
    """EngineOptions kwargs (None = the engine's default, left out)."""
    n, adaptive = None, False
    if draft is not None:
        n, _ = resolve_num_speculative_tokens(cfg.num_speculative_tokens, draft)
        adaptive, _ = decide_adaptive_verification(cfg.adaptive_verification, draft)
    kwargs = {k: getattr(cfg, k) for k in SHARED_KEYS}
    kwargs.update(
        device=cfg.device if cfg.device != "auto" else ("cuda" if num_gpus > 0 else "cpu"),
        num_speculative_tokens=n,
        adaptive_verification=adaptive,
        tp=cfg.tensor_parallel_size,  # vLLM's -tp N: the sampling shared by N ranks
    )
    keep = {"target", "checkpoint"}
    return {k: v for k, v in kwargs.items() if v is not None or k in keep}


def launch_embedded(cfg: ServeCfg, draft: DSparkConfig | None, num_gpus: int) -> int:
    if draft is not None:
        problems = check_checkpoint(cfg.checkpoint)
        if problems:
            raise LaunchRefused(
                f"checkpoint {cfg.checkpoint} is not a valid DSpark draft:\n  "
                + "\n  ".join(problems)
            )
        notes = resolve_num_speculative_tokens(cfg.num_speculative_tokens, draft)[1]
        notes += decide_adaptive_verification(cfg.adaptive_verification, draft)[1]
    else:
        notes = baseline_notes(cfg)
    ignored = ", ".join(changed_keys(cfg, VLLM_ONLY_KEYS))
    if ignored:
        notes.append(f"warning: the embedded engine ignores vLLM-only settings: {ignored}")
    kwargs = embedded_options(cfg, draft, num_gpus)
    for note in notes:
        say(note)
    say("EngineOptions(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")")
    say(
        f"run_server(opts, host={cfg.host!r}, port={cfg.port}, "
        f"served_model_name={cfg.served_model_name!r})"
    )
    if cfg.dry_run:
        return 0
    try:
        from serve.api.server import run_server
        from serve.engine.options import EngineOptions, OptionsError
    except ImportError as e:
        raise LaunchRefused(f"the embedded engine is not available here: {e}") from None
    try:
        opts = EngineOptions(**kwargs)
        run_server(opts, cfg.host, cfg.port, served_model_name=cfg.served_model_name)
    except OptionsError as e:  # the options, or a tp > 1 without its torch.distributed world
        raise LaunchRefused(f"embedded engine options: {e}") from None
    return 0
