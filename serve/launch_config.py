"""The serve config: `ServeCfg` (schema of configs/serve/serve.yaml), overrides, path checks,
which keys only one engine reads, and the two draft decisions both engines make alike (drafts per
step, adaptive verification).

Design choices:
- configs/serve/ is the serve config's own root, apart from the trainer's Hydra groups in
  configs/ (one of which is named `target`, which would clash with the `target=DIR` key).
- Hydra's override grammar (`key=value`, `key=null`, `key=[a,b]`) applied by us, not
  `@hydra.main`: no outputs/ folder or chdir per launch, and the error messages and exit codes
  are ours (`LaunchRefused` names the key; the launcher exits 2).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.config import ConfigError, DSparkConfig
from common.spec_config import DRAFT_SAMPLE_METHODS, has_feature

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "serve"
TRAIN_COMMAND = "bash scripts/quickstart.sh"
ENGINES = ("auto", "vllm", "embedded")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")

# ServeCfg keys only vLLM reads (the embedded engine says it ignores them).
VLLM_ONLY_KEYS = (
    "draft_tensor_parallel_size",
    "batch_sharded_sampling",
    "max_logprobs",
    "enforce_eager",
    "attention_backend",
    "extra_vllm_args",
)
# ServeCfg keys only the embedded engine reads (a vLLM launch says it ignores them).
EMBEDDED_ONLY_KEYS = (
    "device",
    "adaptive_policy",
    "adaptive_budget_confidence",
    "cost_table",
    "sps_table",
    "use_fp64_gumbel",
)


class LaunchRefused(ValueError):
    """A launch that must not happen; the message says what to change."""


@dataclass
class ServeCfg:
    """Schema of configs/serve/serve.yaml (comments there)."""

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
    adaptive_policy: str = "vllm"
    adaptive_budget_confidence: str = "current"
    cost_table: str | None = None
    sps_table: str | None = None
    use_fp64_gumbel: bool = False
    dry_run: bool = False

    def __post_init__(self):
        def need(ok: bool, msg: str):
            if not ok:
                raise LaunchRefused(msg)

        need(self.engine in ENGINES, f"engine={self.engine!r}: choose one of {list(ENGINES)}.")
        need(
            self.draft_sampling in DRAFT_SAMPLE_METHODS,
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
    """configs/serve/serve.yaml + overrides -> a validated ServeCfg; `LaunchRefused` names the
    key."""
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


def changed_keys(cfg: ServeCfg, keys) -> list[str]:
    """Those of `keys` whose value differs from the schema default."""
    defaults = ServeCfg()
    return [k for k in keys if getattr(cfg, k) != getattr(defaults, k)]


def resolve_num_speculative_tokens(
    requested: int | None, cfg: DSparkConfig
) -> tuple[int, list[str]]:
    """Drafts per step (`DSparkConfig.drafts_per_step`: the checkpoint's layout unless lowered),
    with the notes that say where the number came from."""
    try:
        n = cfg.drafts_per_step(requested)
    except ConfigError as e:
        raise LaunchRefused(str(e)) from None
    native, layout = cfg.num_speculative_tokens, cfg.layout_name
    if requested is None:
        return n, [f"num_speculative_tokens={n} (block_size={cfg.block_size}, {layout} layout)"]
    notes = [f"num_speculative_tokens={n} (checkpoint layout: {native}, {layout})"]
    if n < native:
        notes.append(f"warning: drafting {n} of the {native} tokens the draft was trained for")
    return n, notes


def decide_adaptive_verification(
    requested: bool,
    cfg: DSparkConfig,
    *,
    enforce_eager: bool = False,
    vllm_version: str | None = None,
    calibrated: bool | None = None,
) -> tuple[bool, list[str]]:
    """enable_adaptive_verification only with a trained confidence head (without one, vLLM fits an
    online acceptance estimator instead). Refused with enforce_eager: vLLM's adaptive
    verification needs full CUDA graphs. A vLLM without the feature gets the key dropped later
    (`common.spec_config.fit_to_vllm`), so nothing is refused for it.

    `calibrated`: whether the engine will read calibrated confidences (vLLM: a temperature folded
    into the head's weights; the embedded engine: confidence_calibration.json); False adds a
    warning, None (not checked) nothing. The budget multiplies the confidences into survivals, so
    a raw head, over-confident on held-out text, misprices every draft it admits or cuts."""
    if not requested:
        return False, ["adaptive verification: off"]
    if not cfg.enable_confidence_head:
        return False, [
            "warning: adaptive_verification=true but the checkpoint has no confidence head; "
            "leaving enable_adaptive_verification off (vLLM would fall back to an online "
            "acceptance estimator)"
        ]
    if enforce_eager and has_feature(vllm_version, "adaptive_verification"):
        raise LaunchRefused(
            "adaptive_verification=true with enforce_eager=true: vLLM's adaptive verification "
            "requires full CUDA graphs. Set enforce_eager=false or adaptive_verification=false."
        )
    notes = ["adaptive verification: on (confidence head)"]
    if calibrated is False:
        notes.append(
            "warning: the confidence head is not calibrated for this engine (vLLM reads only a "
            "temperature folded into its weights: python -m train.publish.calibrate CKPT "
            "--target TARGET --fold-into-weights; the embedded engine reads "
            "confidence_calibration.json): the draft budget is priced with raw confidences"
        )
    return True, notes
