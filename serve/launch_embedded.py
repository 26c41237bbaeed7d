"""The embedded branch of `serve.launch`: `EngineOptions` from the serve config (pure, with the
notes behind them), then this repo's OpenAI-compatible server (imported only when it runs).

The launch validated the checkpoint against the target already: the options say so
(`checkpoint_checked`), so the engine's loader does not repeat it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.config import DSparkConfig
from common.sampling.calibration import CALIBRATION_NAME
from serve.launch_config import (
    VLLM_ONLY_KEYS,
    LaunchRefused,
    ServeCfg,
    changed_keys,
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


def embedded_options(
    cfg: ServeCfg, draft: DSparkConfig | None, num_gpus: int
) -> tuple[dict[str, Any], list[str]]:
    """-> (EngineOptions kwargs, notes); None values (the engine's defaults) are left out."""
    n, adaptive, notes = None, False, []
    if draft is not None:
        n, notes = resolve_num_speculative_tokens(cfg.num_speculative_tokens, draft)
        adaptive, msgs = decide_adaptive_verification(
            cfg.adaptive_verification,
            draft,
            calibrated=(Path(cfg.checkpoint) / CALIBRATION_NAME).is_file()
            if cfg.checkpoint
            else None,
        )
        notes += msgs
    ignored = ", ".join(changed_keys(cfg, VLLM_ONLY_KEYS))
    if ignored:
        notes.append(f"warning: the embedded engine ignores vLLM-only settings: {ignored}")
    kwargs = {k: getattr(cfg, k) for k in SHARED_KEYS}
    kwargs.update(
        device=cfg.device if cfg.device != "auto" else ("cuda" if num_gpus > 0 else "cpu"),
        num_speculative_tokens=n,
        adaptive_verification=adaptive,
        tp=cfg.tensor_parallel_size,  # vLLM's -tp N: the sampling shared by N ranks
        checkpoint_checked=draft is not None,
    )
    keep = {"target", "checkpoint"}
    return {k: v for k, v in kwargs.items() if v is not None or k in keep}, notes


def run_embedded(kwargs: dict[str, Any], host: str, port: int, served_model_name: str | None):
    """Build the options and serve until interrupted (blocking)."""
    try:
        from serve.api.server import run_server
        from serve.engine.options import EngineOptions, OptionsError
    except ImportError as e:
        raise LaunchRefused(f"the embedded engine is not available here: {e}") from None
    try:
        opts = EngineOptions(**kwargs)
        run_server(opts, host, port, served_model_name=served_model_name)
    except OptionsError as e:  # the options, or a tp > 1 without its torch.distributed world
        raise LaunchRefused(f"embedded engine options: {e}") from None
