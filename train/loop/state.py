"""Training checkpoints: atomic, rotating, exactly resumable, never lost to a failed write.

Layout: OUTPUT/checkpoints/step-000050/ = accelerate's `save_state` (model, optimizer, scheduler,
RNG of every rank) + `trainer_state.json` (step, data-loader position, run fingerprint), and
OUTPUT/checkpoints/LAST_GOOD naming the checkpoint to resume from.

Design choices:
- A checkpoint is written to a hidden temp folder and renamed into place only when every rank is
  done, so a crash, a kill -9 or an `OSError` mid-write never leaves a half checkpoint that
  `latest_checkpoint` would pick up; a failed save removes its temp folder and re-raises.
- `LAST_GOOD` is rewritten (temp file + `os.replace`) after each complete save and read first by
  `latest_checkpoint`: a run that diverges marks the checkpoint before the bad step there, and
  nothing written later by a broken run can take its place.
- Free space is checked before writing (`common.checkpoint.check_free_space`): the expected size is
  the larger of the newest checkpoint on disk and the tensors about to be written, plus a margin.
- Rotation renames an old checkpoint to a hidden name before deleting it, so a kill during the
  delete never leaves a half-deleted `step-*` folder that looks complete.
- What a killed save leaves (hidden temp folders, a half-deleted `.old-step-N`, a `LAST_GOOD` temp
  file) is removed at the start of the next save, before the free-space check: it is never resumed
  from, it holds disk space, and a leftover `.old-step-N` made the next rotation of a checkpoint
  with that name (an `overwrite=true` run into the same folder) fail after its save.
Anchors are drawn from generators keyed by (seed, step, row), so no extra RNG is saved.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from common.atomic_file import write_whole
from common.checkpoint import check_free_space, replace_dir
from train.errors import SetupError

STEP_RE = re.compile(r"^step-(\d+)$")
STATE_NAME = "trainer_state.json"
LAST_GOOD_NAME = "LAST_GOOD"
# Hidden names a checkpoint save writes beside step-N: its temp folder, a rotated checkpoint being
# deleted, the LAST_GOOD temp file, and `replace_dir`'s move-aside folder (filesystems without an
# atomic exchange).
CHECKPOINT_LEFTOVERS = (".tmp-step-*", ".old-step-*", f".{LAST_GOOD_NAME}.tmp-*", ".step-*.old-*")
MOVED_ASIDE_RE = re.compile(r"^\.(.+)\.old-[^/]*$")
# accelerate's RNG/sampler/scheduler pickles and the JSON state, beyond the tensors counted below.
SAVE_OVERHEAD_BYTES = 1 << 20


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.match(p.name))]
    return [p for _, p in sorted(found) if (p / STATE_NAME).exists()]


def last_good_checkpoint(output_dir: Path) -> Path | None:
    """The checkpoint `LAST_GOOD` names, if that folder is complete; None otherwise."""
    marker = output_dir / "checkpoints" / LAST_GOOD_NAME
    try:
        name = marker.read_text().strip()
    except OSError:
        return None
    ckpt = marker.parent / name
    return ckpt if STEP_RE.match(name) and (ckpt / STATE_NAME).exists() else None


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The checkpoint to resume from: `LAST_GOOD` when it names a complete one, else the newest."""
    marked = last_good_checkpoint(output_dir)
    if marked is not None:
        return marked
    dirs = checkpoint_dirs(output_dir)
    return dirs[-1] if dirs else None


def mark_last_good(output_dir: Path, ckpt: Path) -> None:
    write_whole(output_dir / "checkpoints" / LAST_GOOD_NAME, ckpt.name + "\n")


def clear_leftovers(parent: Path, patterns) -> list[str]:
    """Remove what saves killed midway left in `parent` (names matching `patterns`); returns them.

    The one such thing that can hold the only copy of a folder is `replace_dir`'s move-aside
    `.NAME.old-XXXX/NAME` when the kill fell between its two renames (NAME then missing): it is
    put back instead."""
    removed = []
    for pattern in patterns:
        for p in sorted(parent.glob(pattern)):
            m = MOVED_ASIDE_RE.match(p.name)
            if m and (p / m.group(1)).is_dir() and not (parent / m.group(1)).exists():
                (p / m.group(1)).rename(parent / m.group(1))
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def expected_save_bytes(accelerator, output_dir: Path) -> int:
    """What the next save writes: the parameters, buffers and optimizer state of every prepared
    model and optimizer, or the size of the newest checkpoint on disk if that is larger. Read from
    the tensors directly, never through `state_dict()`, which under FSDP is a collective (this runs
    on the main process only)."""
    now = 0
    for m in getattr(accelerator, "_models", []):
        now += sum(_tensor_bytes(t) for t in (*m.parameters(), *m.buffers()))
    for o in getattr(accelerator, "_optimizers", []):
        now += sum(_tensor_bytes(st) for st in getattr(o, "optimizer", o).state.values())
    if str(accelerator.distributed_type).endswith("FSDP"):  # each rank holds a shard
        now *= accelerator.num_processes
    dirs = checkpoint_dirs(output_dir)
    return max(now + SAVE_OVERHEAD_BYTES, _dir_bytes(dirs[-1]) if dirs else 0)


def save_checkpoint_state(accelerator, output_dir: Path, step: int, state: dict, keep_last: int):
    root = output_dir / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        clear_leftovers(root, CHECKPOINT_LEFTOVERS)  # also this step's temp folder
        check_free_space(root, expected_save_bytes(accelerator, output_dir), f"checkpoint {final}")
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(output_dir=str(tmp), safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (tmp / STATE_NAME).write_text(json.dumps({**state, "step": step}, indent=2))
            replace_dir(tmp, final)
            mark_last_good(output_dir, final)
    except BaseException:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if accelerator.is_main_process:
        for old in checkpoint_dirs(output_dir)[:-keep_last] if keep_last > 0 else []:
            if old != final:
                doomed = old.with_name(f".old-{old.name}")
                old.rename(doomed)
                shutil.rmtree(doomed, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def setting_differences(
    saved: dict, now: dict, now_label: str = "now", ignore: tuple[str, ...] = ()
) -> list[str]:
    """'key: checkpoint X vs NOW_LABEL Y' for each key (but `ignore`) whose values differ."""
    keys = sorted((set(saved) | set(now)) - set(ignore))
    return [
        f"{k}: checkpoint {saved.get(k)!r} vs {now_label} {now.get(k)!r}"
        for k in keys
        if saved.get(k) != now.get(k)
    ]


def load_checkpoint_state(accelerator, ckpt: Path, fingerprint: dict) -> dict:
    """Restore accelerate state from `ckpt`; refuse a checkpoint of an incompatible run."""
    state = json.loads((ckpt / STATE_NAME).read_text())
    diffs = setting_differences(state.get("fingerprint", {}), fingerprint)
    if diffs:
        detail = "; ".join(diffs)
        raise SetupError(
            f"cannot resume from {ckpt}: incompatible run ({detail}). Restore those settings, or "
            "start afresh with resume=false overwrite=true."
        )
    accelerator.load_state(str(ckpt))
    return state
