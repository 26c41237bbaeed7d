"""Small source files for the recipe tests: a ShareGPT JSON whose conversations repeat user turns
under other ids (as the real one does), and a HumanEval JSONL of a few tasks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

TOPICS = ["lists", "files", "strings", "numbers", "dates", "sets", "loops", "classes", "tests"]


def sharegpt_conversations(n: int = 120, repeats: int = 30) -> list[dict]:
    """`n` conversations, then `repeats` more whose user turn copies an earlier one's with other
    case and spacing (new ids), so a split by id alone leaks them."""
    convs = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        user = f"How do I work with {topic} in Python? Question number {i}."
        answer = f"Use the built-in tools for {topic}; for example number {i} works."
        convs.append(
            {
                "id": f"c{i}_0",
                "conversations": [
                    {"from": "human", "value": user},
                    {"from": "gpt", "value": answer},
                ],
            }
        )
    for j in range(repeats):
        src = convs[(7 * j) % n]["conversations"]
        user = "  " + src[0]["value"].upper().replace(" ", "   ") + "\n"
        convs.append(
            {
                "id": f"r{j}_0",
                "conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": "ok"}],
            }
        )
    return convs


def write_sharegpt(path: Path, **kw) -> Path:
    path.write_text(json.dumps(sharegpt_conversations(**kw)))
    return path


def write_humaneval(path: Path, n: int = 6) -> Path:
    with gzip.open(path, "wt") as f:
        for i in range(n):
            prompt = f'def add_{i}(a, b):\n    """Return a + b + {i}."""\n'
            f.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": prompt}) + "\n")
    return path
