"""`python -m train.recipe NAME [--out DIR] [--from STAGE] [--until STAGE] [key=value ...]`:
a target to a served draft in one command.

Stages, in order (train/recipe/stages.py says what each runs and writes under `OUT/STAGE/`):
target -> prompts -> regenerate -> distill -> evaluate -> export. A recipe is a config,
`configs/recipe/NAME.yaml` (train/recipe/config.py types every key; `key=value` overrides one).

Resumable: a stage is skipped when `OUT/STAGE/done.json` holds the key of its settings and inputs
and its outputs are intact (train/recipe/state.py); rerunning the same command after a kill, or
on another machine given the `OUT/` folders, goes on where it stopped, and a stage whose command
resumes (regenerate, distill) continues its own partial work. A changed setting or input reruns
that stage and, where its outputs change, every later one.

`--from STAGE` reruns STAGE and every later stage even where done (earlier ones are not run; a
stage whose inputs are not done stops the run: `--from prompts --until prompts` needs no target);
`--until STAGE` stops after STAGE. Prints one start / skip / done line per stage.
Exit codes: 0 done, 2 a bad recipe name, key or argument, or a stage's inputs not done (after
`--from`), 1 a stage failed (its command's own output says why), 128+N a signal.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from train.publish.package_files import PackageFileError
from train.recipe.config import STAGES, BadRecipe, load_recipe, recipe_names
from train.recipe.stages import STAGE_LIST, StageError
from train.recipe.state import (
    identity,
    is_done,
    prepare_folder,
    read_done,
    stage_key,
    write_done,
)


def log(msg: str) -> None:
    print(f"[recipe] {msg}", flush=True)


def upstream_digests(out: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The identity of each named stage (its outputs digest unless it names another; each is done:
    checked by `run`)."""
    return {name: identity(read_done(out / name)) for name in names}


def run(cfg, out: Path, first: str | None, last: str) -> int:
    """Run the stages up to `last`; from `first` on every stage reruns (None: skip done ones)."""
    out.mkdir(parents=True, exist_ok=True)
    start, stop = STAGES.index(first or STAGES[0]), STAGES.index(last)
    state: dict[str, str] = {}  # stage -> "" when done under its current key, else why not
    for i, stage in enumerate(STAGE_LIST):
        if i > stop:
            break
        folder = out / stage.name
        stale = {s: state[s] for s in stage.upstream if state[s]}
        if stale:
            state[stage.name] = "its inputs are not done"
            if i < start:
                continue
            log(
                f"{stage.name}: cannot run: "
                + "; ".join(f"{s} not done ({w})" for s, w in stale.items())
            )
            return 2
        settings = stage.settings(cfg)
        key = stage_key(settings, upstream_digests(out, stage.upstream), stage.external(cfg))
        done, why = is_done(folder, key)
        state[stage.name] = why
        if i < start:  # not run; a later stage that reads it needs it done
            log(f"{stage.name}: skip (before --from {first})")
            continue
        if done and first is None:
            log(f"{stage.name}: skip (done, {read_done(folder)['seconds']} s)")
            continue
        resumed = prepare_folder(folder, key)
        why = "rerun from --from" if done else why
        if why == "unfinished" and not resumed:
            why = "an unfinished run of other settings or inputs: starting afresh"
        log(f"{stage.name}: start ({'continuing an unfinished run' if resumed else why})")
        t0 = time.perf_counter()
        try:
            commands = stage.run(cfg, out, folder)
        except (StageError, PackageFileError, OSError, ValueError) as e:
            # a command's own output says more; an in-process stage's error is this one line
            log(f"{stage.name}: failed: {e}")
            return 1
        commands = [[str(c) for c in cmd] if isinstance(cmd, list) else cmd for cmd in commands]
        seconds = time.perf_counter() - t0
        write_done(
            folder, key, settings, commands, seconds, stage.scratch, stage.same_identity_as_key(cfg)
        )
        state[stage.name] = ""
        log(f"{stage.name}: done in {seconds:.1f} s -> {folder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m train.recipe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("name", help=f"a recipe: {', '.join(recipe_names())}")
    ap.add_argument("--out", help="stage outputs (default: the recipe's `out`)")
    ap.add_argument("--from", dest="first", choices=STAGES, help="rerun from this stage on")
    ap.add_argument("--until", dest="last", choices=STAGES, default=STAGES[-1], help="stop after")
    ap.add_argument("overrides", nargs="*", help="recipe key=value")
    a = ap.parse_intermixed_args(argv)
    if a.first and STAGES.index(a.first) > STAGES.index(a.last):
        ap.error(f"--from {a.first} comes after --until {a.last}")
    try:
        cfg = load_recipe(a.name, a.overrides)
    except BadRecipe as e:
        print(f"[recipe] error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out or cfg.out).expanduser().resolve()
    log(f"{cfg.name}: stages {a.first or STAGES[0]} .. {a.last} into {out}")
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a kill stops the running command too
    try:
        return run(cfg, out, a.first, a.last)
    except KeyboardInterrupt as e:
        code = e.args[0] if e.args else 128 + signal.SIGINT
        log(f"stopped by a signal; rerun the same command to continue (exit {code})")
        return code


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
