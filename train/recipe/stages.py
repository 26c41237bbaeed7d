"""The six stages of `python -m train.recipe`: what each reads, what it runs, what it writes.

Each stage runs the product's own command (a subprocess, so a stage runs exactly as a user would
type it; `Ctrl-C` or a kill of the recipe reaches it) or, where no command exists, a function in
this process. Its outputs go to `OUT/STAGE/`:

    target/model/             the target (train.prepare.target NAME, or the tiny target)
    prompts/*.jsonl           train + dev/test per domain, disjoint (train/recipe/prompts.py)
    regenerate/train.jsonl    the target's own answers (train.prepare.regenerate, resumable)
    regenerate/dev.jsonl      dev prompts answered: distill's held-out rows
    distill/run/final/        the draft (train.distill experiment=..., resume=auto continues)
    evaluate/{dev,test}/      python -m serve.evaluate: eval.json per split
    export/draft/             the draft, its confidence head calibrated on the dev answers
                              (train.publish.calibrate --fold-into-weights), with a model card
                              whose figures are test's only

`settings` is what a stage's key covers (train/recipe/state.py); `upstream` the earlier stages
whose outputs it reads; `scratch` what it keeps only to continue an unfinished run (not an output:
a done stage stays done without it); `same_identity_as_key` whether later stages are keyed on its
settings rather than its outputs' bytes (a named target: rebuilt from its checked source anywhere).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from train.recipe.config import TINY_TARGET


class StageError(RuntimeError):
    """A stage's command failed; the message names the stage and the command."""


@dataclass
class Stage:
    name: str
    upstream: tuple[str, ...]
    settings: Callable[[object], dict]
    run: Callable[[object, Path, Path], list]  # (cfg, OUT, stage folder) -> commands run
    external: Callable[[object], list[Path]] = lambda cfg: []
    scratch: tuple[str, ...] = ()
    same_identity_as_key: Callable[[object], bool] = lambda cfg: False


def run_command(cmd: list[str]) -> list[str]:
    """Run `cmd` (output passes through); -> cmd. A non-zero exit is a StageError; an interrupt
    stops the child first (SIGTERM: distill saves the step under way), then propagates."""
    print(f"[recipe]   $ {' '.join(cmd)}", flush=True)
    child = subprocess.Popen(cmd)
    try:
        code = child.wait()
    except BaseException:
        child.terminate()
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
        raise
    if code != 0:
        raise StageError(f"exit {code} from: {' '.join(cmd)}")
    return cmd


def _py(module: str, *args) -> list[str]:
    return [sys.executable, "-m", module, *[str(a) for a in args]]


def _section(cfg, key: str) -> dict:
    return OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=True)


def target_path(out: Path) -> Path:
    return out / "target" / "model"


# --- target -------------------------------------------------------------------------------


def _target_settings(cfg) -> dict:
    t = _section(cfg, "target")
    t.pop("parts_dir")  # where the parts come from does not change the bytes (they are checked)
    if t["name"] != TINY_TARGET:
        t.pop("tiny_steps"), t.pop("tiny_max_files")
    return t


def _run_target(cfg, out: Path, folder: Path) -> list:
    t = cfg.target
    model = target_path(out)
    if t.name == TINY_TARGET:
        from train.tiny_target.build import build_tiny_target

        build_tiny_target(model, steps=t.tiny_steps, max_files=t.tiny_max_files, threads=2)
        return [f"train.tiny_target.build.build_tiny_target({model}, steps={t.tiny_steps})"]
    args = [t.name, "--out", model]
    args += ["--parts-dir", t.parts_dir] if t.parts_dir else []
    return [run_command(_py("train.prepare.target", *args))]


# --- prompts ------------------------------------------------------------------------------


def _prompts_settings(cfg) -> dict:
    # The installed package versions and the Python the code prompts come from are recorded in
    # report.json, not in the key: a GPU host given the prompts folder must find it done.
    return _section(cfg, "prompts")


def _prompts_files(cfg) -> list[Path]:
    files = [cfg.prompts.chat.file, cfg.prompts.code.humaneval_file]
    return [Path(f).expanduser().resolve() for f in files if f]


def _run_prompts(cfg, out: Path, folder: Path) -> list:
    from train.recipe.prompts import build_prompts

    report = build_prompts(cfg.prompts, folder)
    print(
        f"[recipe] prompts: {report['rows']}; dropped for overlap: "
        + ", ".join(
            f"{k} {v['dropped']}" for k, v in report["overlap"].items() if isinstance(v, dict)
        )
    )
    return ["train.recipe.prompts.build_prompts"]


# --- regenerate ---------------------------------------------------------------------------


def _run_regenerate(cfg, out: Path, folder: Path) -> list:
    from train.data.packaged import write_jsonl

    r, prompts = cfg.regenerate, out / "prompts"
    dev = [
        _read_jsonl(prompts / f"dev.{d}.jsonl")[: (r.dev_rows + 1) // 2] for d in ("chat", "code")
    ]
    dev_prompts = folder / "dev.prompts.jsonl"
    if not dev_prompts.is_file():
        write_jsonl(dev[0] + dev[1], dev_prompts)
    common = [
        "--target",
        target_path(out),
        "--backend",
        r.backend,
        "--temperature",
        r.temperature,
        "--top-p",
        r.top_p,
        "--max-new-tokens",
        r.max_new_tokens,
        "--batch-size",
        r.batch_size,
        "--seed",
        r.seed,
        *r.extra_args,
    ]
    cmds = []
    for data, dest in ((prompts / "train.jsonl", "train.jsonl"), (dev_prompts, "dev.jsonl")):
        cmds.append(
            run_command(
                _py("train.prepare.regenerate", "--data", data, "--out", folder / dest, *common)
            )
        )
    return cmds


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --- distill ------------------------------------------------------------------------------


def final_draft(out: Path) -> Path:
    return out / "distill" / "run" / "final"


def _run_distill(cfg, out: Path, folder: Path) -> list:
    regen = out / "regenerate"
    args = [
        f"+experiment={cfg.distill.experiment}",
        f"target.path={target_path(out)}",
        "target.build_tiny=false",
        "target.prepare=null",
        f"data.train={regen / 'train.jsonl'}",
        f"data.heldout={regen / 'dev.jsonl'}",
        f"output_dir={folder / 'run'}",
        "resume=auto",  # continues from the last checkpoint of an unfinished run of this key
        *cfg.distill.overrides,
    ]
    return [run_command(_py("train.distill", *args))]


# --- evaluate -----------------------------------------------------------------------------


def _run_evaluate(cfg, out: Path, folder: Path) -> list:
    e, cmds = cfg.evaluate, []
    for split in e.splits:
        dest = folder / split
        if (dest / "eval.json").is_file():  # this split finished before a kill
            continue
        args = [
            "--target",
            target_path(out),
            "--draft",
            f"{cfg.name}={final_draft(out)}",
            "--prompts",
        ]
        args += [f"{d}={out / 'prompts' / f'{split}.{d}.jsonl'}" for d in ("code", "chat")]
        args += ["--out", dest, "--temperatures", *e.temperatures]
        args += ["--max-new-tokens", e.max_new_tokens, "--seed", e.seed]
        args += ["--num-spec", e.num_spec] if e.num_spec is not None else []
        args += ["--max-prompts", e.max_prompts] if e.max_prompts is not None else []
        cmds.append(run_command(_py("serve.evaluate", *args)))
    return cmds


# --- export -------------------------------------------------------------------------------


def _calibrate(out: Path, ckpt: Path) -> tuple[list[str], dict]:
    """The confidence head calibrated on the dev answers (distill's held-out rows), one shared
    temperature folded into its weights: vLLM reads only the weights, and adaptive verification
    budgets verification by these confidences. -> (command, calibration.json's ECE columns)."""
    from common.sampling.calibration import CALIBRATION_NAME

    cmd = run_command(
        _py(
            "train.publish.calibrate",
            ckpt,
            "--target",
            target_path(out),
            "--data",
            out / "regenerate" / "dev.jsonl",
            "--fold-into-weights",
        )
    )
    result = json.loads((ckpt / CALIBRATION_NAME).read_text())
    keys = ("ece_before", "ece_after_shared", "folded_temperature")
    return cmd, {f"calibration/{k}": result[k] for k in keys if k in result}


def _run_export(cfg, out: Path, folder: Path) -> list:
    from common.checkpoint import PROVENANCE_NAME, read_config
    from train.publish.model_card import write_model_card

    split = cfg.export.figures_split
    eval_json = out / "evaluate" / split / "eval.json"
    figures = _numbers(json.loads(eval_json.read_text())) if eval_json.is_file() else {}
    dest, tmp = folder / "draft", folder / ".draft.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(final_draft(out), tmp)
    cmds, calibration = [], {}
    if cfg.export.calibrate and read_config(tmp).enable_confidence_head:
        cmd, calibration = _calibrate(out, tmp)
        cmds.append(cmd)
    prov = (
        json.loads((tmp / PROVENANCE_NAME).read_text()) if (tmp / PROVENANCE_NAME).is_file() else {}
    )
    per_pos = prov.get("expected_acceptance", {}).get("per_position", [])
    recipe = {"recipe": cfg.name, "distill": cfg.distill.experiment, "figures": f"{split} set"}
    write_model_card(
        tmp,
        target=str(target_path(out)),
        recipe=recipe,
        metrics={**{f"{split}/{k}": v for k, v in figures.items()}, **calibration},
        per_position_acceptance=per_pos,
        local_path=dest,
    )
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    card = f"{split} figures from {eval_json}" if figures else f"no {split} evaluation: no figures"
    return [*cmds, f"copy {final_draft(out)} -> {dest}; model card: {card}"]


def _numbers(d, prefix: str = "", limit: int = 60) -> dict:
    """Flatten the numeric leaves of eval.json into `a/b/c` keys (at most `limit`)."""
    out: dict = {}
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else []
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[key] = v
        elif isinstance(v, (dict, list)):
            out.update(_numbers(v, key + "/", limit))
        if len(out) >= limit:
            break
    return dict(list(out.items())[:limit])


STAGE_LIST = [
    # the tiny target is trained here, so its bytes are what it is; a named one is checked
    # against its source's sha256 before conversion
    Stage(
        "target",
        (),
        _target_settings,
        _run_target,
        same_identity_as_key=lambda c: c.target.name != TINY_TARGET,
    ),
    Stage("prompts", (), _prompts_settings, _run_prompts, _prompts_files),
    Stage(
        "regenerate", ("target", "prompts"), lambda c: _section(c, "regenerate"), _run_regenerate
    ),
    Stage(
        "distill",
        ("target", "regenerate"),
        lambda c: _section(c, "distill"),
        _run_distill,
        scratch=("run/checkpoints",),  # train/loop/state.py: OUTPUT/checkpoints/step-N
    ),
    Stage(
        "evaluate",
        ("target", "prompts", "distill"),
        lambda c: _section(c, "evaluate"),
        _run_evaluate,
    ),
    Stage(
        "export",
        ("distill", "evaluate"),
        lambda c: {**_section(c, "export"), "name": c.name},
        _run_export,
    ),
]
