"""Training checkpoints: atomic, rotating, exactly resumable.

Layout: OUTPUT/checkpoints/step-000050/ = accelerate's `save_state` (model, optimizer, scheduler,
RNG of every rank) + `trainer_state.json` (step, data-loader position, run fingerprint). A
checkpoint is written to a hidden temp folder and renamed into place only when every rank is done,
so a crash mid-write never leaves a half checkpoint that `latest_checkpoint` would pick up.
Anchors are drawn from generators keyed by (seed, step, rank, micro), so no extra RNG is saved.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from train.setup import SetupError

STEP_RE = re.compile(r"^step-(\d+)$")
STATE_NAME = "trainer_state.json"


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.match(p.name))]
    return [p for _, p in sorted(found) if (p / STATE_NAME).exists()]


def latest_checkpoint(output_dir: Path) -> Path | None:
    dirs = checkpoint_dirs(output_dir)
    return dirs[-1] if dirs else None


def save_checkpoint_state(accelerator, output_dir: Path, step: int, state: dict, keep_last: int):
    root = output_dir / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(output_dir=str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_NAME).write_text(json.dumps({**state, "step": step}, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in checkpoint_dirs(output_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint_state(accelerator, ckpt: Path, fingerprint: dict) -> dict:
    """Restore accelerate state from `ckpt`; refuse a checkpoint of an incompatible run."""
    state = json.loads((ckpt / STATE_NAME).read_text())
    saved = state.get("fingerprint", {})
    diffs = [k for k in sorted(set(saved) | set(fingerprint)) if saved.get(k) != fingerprint.get(k)]
    if diffs:
        detail = "; ".join(
            f"{k}: checkpoint {saved.get(k)!r} vs now {fingerprint.get(k)!r}" for k in diffs
        )
        raise SetupError(
            f"cannot resume from {ckpt}: incompatible run ({detail}). Restore those settings, or "
            "start afresh with resume=false overwrite=true."
        )
    accelerator.load_state(str(ckpt))
    return state
