"""What `serve.launch` prints: one prefix, the installed vLLM's missing seed features, and the
notes both engines share."""

from __future__ import annotations

from common.spec_config import NEWEST_VLLM, missing_features
from serve.launch_config import ServeCfg


def say(msg: str) -> None:
    print(f"serve.launch: {msg}", flush=True)


def vllm_feature_lines(vllm_version: str | None) -> list[str]:
    """One line per seed feature the installed vLLM lacks, with what runs instead."""
    if vllm_version is None:
        newest = ".".join(map(str, NEWEST_VLLM))
        return [f"vLLM is not installed: the command is written for vLLM {newest}"]
    return [
        f"vLLM {vllm_version} lacks {f.what} (since {'.'.join(map(str, f.since))}): {f.without}"
        for f in missing_features(vllm_version)
    ]


def baseline_notes(cfg: ServeCfg) -> list[str]:
    """Notes for a launch without a draft (checkpoint=null)."""
    notes = ["checkpoint=null: serving the target alone (no speculative decoding)"]
    if cfg.adaptive_verification:
        notes.append("warning: adaptive_verification ignored without a checkpoint")
    return notes
