"""Compose `configs/distill.yaml` with Hydra and validate it against `train.schema`.

Any problem (unknown key, wrong type, bad choice, missing experiment) raises `BadConfig` whose
one-line message names the key; `train.distill` turns it into exit code 2. We use Hydra's compose
API rather than `@hydra.main` so that errors are ours to format and nothing is written before
validation.

Design choices:
- Every override is checked against the schema before Hydra sees it (`check_overrides`): a key
  outside it is refused whether or not it carries `+` (Hydra would add a `+key` silently), with the
  nearest valid key; a value of the wrong type names the type the key takes; a group choice
  (`+experiment=NAME`, `target=NAME`, ...) must be a file of that group, and every choice is
  listed. Only the free-form dicts (`extra`, `data.chat_template_kwargs`) take keys of any name.
- The composed config is walked against the schema too, so an unknown key in an experiment file is
  refused the same way.
- `experiment=NAME` is taken as `+experiment=NAME` (experiments are not in the defaults list), and
  `+key=value` for a schema key as `key=value` (every schema key exists already).
"""

from __future__ import annotations

import dataclasses
import difflib
import textwrap
import types
import typing
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from train.loop.optim_groups import check_markov_options
from train.schema import CHOICES, RESUME_CHOICES, DistillCfg

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


class BadConfig(ValueError):
    pass


def compose_config(overrides: list[str], config_name: str = "distill") -> DictConfig:
    """-> a resolved, schema-checked DictConfig (attribute access, typed).

    The schema is the first entry of distill.yaml's defaults list, so every schema field can be
    overridden with plain `key=value` even where no YAML file mentions it."""
    overrides = check_overrides(overrides)
    ConfigStore.instance().store(name="distill_schema", node=DistillCfg)
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            raw = compose(config_name, overrides=list(overrides))
        _check_keys(OmegaConf.to_container(raw, resolve=False), "")
        cfg = OmegaConf.merge(OmegaConf.structured(DistillCfg), raw)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        raise BadConfig(_one_line(e)) from e
    resume = str(cfg.resume).lower()
    if resume not in RESUME_CHOICES:
        raise BadConfig(f"resume={cfg.resume!r}: choose one of {', '.join(RESUME_CHOICES)}")
    cfg.resume = {"true": True, "false": False}.get(resume, resume)
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
    """Hydra's message and its cause's (where the reason is), on one line."""
    parts = [e] + ([e.__cause__] if e.__cause__ is not None else [])
    lines = [m.strip() for p in parts for m in str(p).strip().splitlines()]
    return " ".join(m for m in lines if m and not m.startswith(("full_key", "object_type")))


def schema_keys(cls=DistillCfg, prefix: str = "") -> dict[str, object]:
    """Every key of the schema, dotted -> its type hint (nested dataclasses flattened)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.update(schema_keys(hint, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = hint
    return out


KEYS = schema_keys()
FREE_DICTS = tuple(k for k, t in KEYS.items() if typing.get_origin(t) is dict)
SECTIONS = {k.rsplit(".", 1)[0] for k in KEYS if "." in k}


def group_choices(group: str, extra_dirs: tuple[Path, ...] | list[Path] = ()) -> list[str]:
    """The config files of `group` (configs/GROUP/*.yaml, and DIR/GROUP/*.yaml for each of
    `extra_dirs`: the folders a `hydra.searchpath` override adds), by name."""
    return sorted({p.stem for d in (CONFIG_DIR, *extra_dirs) for p in (d / group).glob("*.yaml")})


def searchpath_dirs(parsed) -> tuple[list[Path], bool]:
    """The `file://` folders of a `hydra.searchpath=[...]` override among `parsed`, and whether it
    names any other source (`pkg://...`), whose configs cannot be listed here."""
    dirs, other = [], False
    for o in parsed:
        if o.key_or_group == "hydra.searchpath" and not o.is_sweep_override():
            for entry in o.value() or []:
                if str(entry).startswith("file://"):
                    dirs.append(Path(str(entry).removeprefix("file://")))
                else:
                    other = True
    return dirs, other


def groups() -> list[str]:
    """The config groups of `configs/distill.yaml`'s defaults list, and `experiment`."""
    defaults = OmegaConf.load(CONFIG_DIR / "distill.yaml").defaults
    return ["experiment"] + [next(iter(d)) for d in defaults if isinstance(d, dict | DictConfig)]


def _nearest(key: str) -> str:
    leaf = key.rsplit(".", 1)[-1]  # a right name under a wrong section (or none) first
    close = [k for k in KEYS if k.rsplit(".", 1)[-1] == leaf][:1]
    close = close or difflib.get_close_matches(key, list(KEYS), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def unknown_key(key: str) -> BadConfig:
    return BadConfig(
        f"unknown key {key}{_nearest(key)} (every key: docs/train.md; the common ones: "
        "python -m train.distill --help)"
    )


def _free(key: str) -> bool:
    return any(key.startswith(d + ".") for d in FREE_DICTS)


def _check_keys(node, prefix: str) -> None:
    """Refuse any key of the composed config that the schema lacks."""
    if not isinstance(node, dict):
        return
    for k, v in node.items():
        key = f"{prefix}{k}"
        if key in KEYS or _free(key):
            continue
        if key in SECTIONS:
            _check_keys(v, key + ".")
        elif key != "hydra":
            raise unknown_key(key)


def describe(hint) -> str:
    """A type hint in words: what a value must look like."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        null = " or null" if len(inner) < len(args) else ""
        return " or ".join(describe(a) for a in inner) + null
    if typing.get_origin(hint) is list:
        return f"a list of {describe(args[0]).removeprefix('an ').removeprefix('a ')}s, e.g. [1, 2]"
    if typing.get_origin(hint) is dict:
        return "a mapping (set its keys with +KEY.NAME=VALUE)"
    return {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a string",
    }.get(hint, "any value" if hint is typing.Any else str(hint))


def check_overrides(overrides: list[str]) -> list[str]:
    """-> the overrides Hydra is given; BadConfig for a malformed one, a key outside the schema, a
    value of the wrong type or a group choice that does not exist (see the module doc)."""
    parser, out = OverridesParser.create(), []
    base = OmegaConf.structured(DistillCfg)
    parsed = []
    for text in overrides:
        try:
            (o,) = parser.parse_overrides([text])
        except OverrideParseException:
            raise BadConfig(
                f"cannot read {text!r}: give key=value (python -m train.distill --help)"
            ) from None
        parsed.append(o)
    extra_dirs, unlisted_source = searchpath_dirs(parsed)
    for text, o in zip(overrides, parsed, strict=True):
        key = o.key_or_group
        if key in groups() and o.type.name in ("CHANGE", "ADD", "FORCE_ADD"):
            choices = group_choices(key, extra_dirs)
            value = o.get_value_element_as_str() if not o.is_sweep_override() else None
            if value not in choices and not unlisted_source:
                near = difflib.get_close_matches(str(value), choices, n=1)
                hint = f"; did you mean {near[0]}?" if near else ""
                where = ", ".join([f"configs/{key}/", *(f"{d}/{key}/" for d in extra_dirs)])
                raise BadConfig(
                    f"unknown {key} {value!r}{hint or '.'} Choose one of: {', '.join(choices)} "
                    f"({where})"
                )
            if key == "experiment" and o.type.name == "CHANGE":
                text = "+" + text  # not in the defaults list: `+` adds it
        elif key.startswith("hydra.") or o.type.name == "DEL" or _free(key):
            pass
        elif key not in KEYS:
            raise unknown_key(key)
        else:
            if not o.is_sweep_override():
                try:
                    OmegaConf.update(base, key, o.value(), merge=True)
                except (OmegaConfBaseException, ValueError):
                    raise BadConfig(
                        f"{key}={o.get_value_element_as_str()}: expected {describe(KEYS[key])}"
                    ) from None
            if o.type.name == "ADD":  # every schema key exists: `+` sets it (Hydra would refuse)
                text = text[1:]
        out.append(text)
    return out


# The keys users set most, in the order a first run needs them: (override, what it does).
COMMON_KEYS = (
    ("target=hf target.path=DIR", "the target: a local Hugging Face model folder"),
    ("data.train=FILE", "training rows: .jsonl/.json/.parquet of messages, ShareGPT or text"),
    ("data.seq_len=N", "tokens per training row (rows are packed to it); default 4096"),
    ("output_dir=DIR", "checkpoints, metrics and the export DIR/final; default outputs/NAME"),
    ("trainer.max_steps=N", "optimizer steps"),
    ("trainer.max_seconds=S", "stop after S seconds of training (evaluate, save, export)"),
    ("trainer=gpu", "train on a CUDA GPU (trainer=cpu: on the CPU)"),
    ("resume=auto", "continue output_dir's last checkpoint if any (true: it must exist)"),
    ("dry_run=true", "build everything and export the untrained draft; train nothing"),
    ("print_config=true", "print the composed config and exit"),
)


def usage() -> str:
    """`python -m train.distill --help`: the groups with their choices, the keys users set most,
    and where the full reference lives."""
    width = max(len(k) for k, _ in COMMON_KEYS) + 2
    lines = [
        "usage: python -m train.distill +experiment=NAME [GROUP=CHOICE ...] [key=value ...]",
        "",
        "Distill a DSpark draft for a Hugging Face causal LM. Settings are key=value overrides of",
        "configs/distill.yaml, typed by train/schema.py; a bad key or value stops with one line",
        "(exit 2).",
        "",
        "groups (configs/GROUP/CHOICE.yaml):",
    ]
    for group in groups():
        plus = "+" if group == "experiment" else ""
        lines += textwrap.wrap(
            ", ".join(group_choices(group)),
            width=100,
            initial_indent=f"  {plus}{group}=".ljust(16),
            subsequent_indent=" " * 16,
            break_on_hyphens=False,
        )
    lines += ["", "keys set most often:"]
    lines += [f"  {k:<{width}}{what}" for k, what in COMMON_KEYS]
    lines += [
        "",
        "example: python -m train.distill +experiment=tiny target=hf target.path=DIR "
        "data.train=FILE",
        "every key, its type, default and meaning: docs/train.md",
        "(print_config=true prints the values a command composes)",
    ]
    return "\n".join(lines)
