"""Compose `configs/distill.yaml` with Hydra and validate it against `train.schema`.

Any problem (unknown key, wrong type, bad choice, missing experiment) raises `BadConfig` whose
message names the key; `train.distill` turns it into exit code 2. We use Hydra's compose API rather
than `@hydra.main` so that errors are ours to format and nothing is written before validation.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from train.loop.optim_groups import check_markov_options
from train.schema import CHOICES, DistillCfg

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


class BadConfig(ValueError):
    pass


def compose_config(overrides: list[str], config_name: str = "distill") -> DictConfig:
    """-> a resolved, schema-checked DictConfig (attribute access, typed).

    The schema is the first entry of distill.yaml's defaults list, so every schema field can be
    overridden with plain `key=value` even where no YAML file mentions it."""
    ConfigStore.instance().store(name="distill_schema", node=DistillCfg)
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            raw = compose(config_name, overrides=list(overrides))
        cfg = OmegaConf.merge(OmegaConf.structured(DistillCfg), raw)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        raise BadConfig(_one_line(e)) from e
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise BadConfig(f"{key}={value!r}: choose one of {list(allowed)}")
    for key in ("trainer.max_steps", "trainer.micro_batch_size", "trainer.grad_accum"):
        if OmegaConf.select(cfg, key) < 1:
            raise BadConfig(f"{key} must be >= 1")
    for key in ("trainer.max_seconds", "trainer.print_every"):
        if OmegaConf.select(cfg, key) < 0:
            raise BadConfig(f"{key} must be >= 0 (0: off)")
    if not 0 < cfg.optim.decay_ratio <= 1:
        raise BadConfig(f"optim.decay_ratio={cfg.optim.decay_ratio}: must be in (0, 1]")
    try:
        check_markov_options(cfg.optim.markov_lr_scale, cfg.optim.markov_weight_decay)
    except ValueError as e:
        raise BadConfig(str(e)) from None
    if cfg.data.seq_len < cfg.draft.block_size + 2:
        raise BadConfig(f"data.seq_len={cfg.data.seq_len} is shorter than a block + anchor")
    return cfg


def _one_line(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return " ".join(m.strip() for m in msg if m.strip() and not m.startswith("full_key"))[:500]
