"""Run logging: JSONL file (always), wandb (online/offline/disabled), and the console.

Every record is one JSON object per line with `step` and `split` ("train"/"eval"). On resume the
file is truncated to the resumed step, so it reads exactly like an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from common.atomic_file import write_whole
from train.loop.state import clear_leftovers


class RunLogger:
    def __init__(self, output_dir: Path, lcfg, config: dict, enabled: bool, resume_step: int):
        self.path = output_dir / "metrics.jsonl"
        self.enabled = enabled
        self.wandb = None
        if not enabled:
            return
        # Rewritten beside and swapped in: a kill -9 here must not lose the records it keeps
        # (a killed rewrite leaves only its temp file, removed by the next run).
        clear_leftovers(output_dir, (f".{self.path.name}.tmp-*",))
        if self.path.exists():
            keep = [ln for ln in self.path.read_text().splitlines() if _step(ln) <= resume_step]
            write_whole(self.path, "".join(ln + "\n" for ln in keep))
        if lcfg.backend == "wandb":
            import wandb

            mode = os.environ.get("WANDB_MODE", lcfg.mode)
            id_file = output_dir / "wandb_run_id"
            run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
            id_file.write_text(run_id)
            self.wandb = wandb.init(
                project=lcfg.project,
                entity=lcfg.entity,
                name=lcfg.run_name,
                mode=mode,
                id=run_id,
                resume="allow",
                dir=str(output_dir),
                config=config,
            )

    def log(self, step: int, split: str, record: dict) -> None:
        if not self.enabled:
            return
        rec = {"step": step, "split": split, **record}
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.wandb is not None:
            flat = {}
            for k, v in record.items():
                if isinstance(v, list):
                    flat.update({f"{split}/{k}/{i}": x for i, x in enumerate(v)})
                else:
                    flat[f"{split}/{k}"] = v
            self.wandb.log(flat, step=step)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


def _step(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError):
        return 1 << 62
