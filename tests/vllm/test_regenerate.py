"""Response regeneration (`train.data.regenerate.regenerate_responses`) with real `vllm.LLM` on CPU
gives the same greedy answers as the HF backend.

vLLM runs in its own process (`scripts/vllm_probe/regen_vllm.py`): `vllm.LLM` starts an engine
core with its own distributed state, which must not meet the vLLM modules other tests build in
this process. Greedy equality is only meaningful when top-1 margins are wide, so the targets are
trained: the word-level target of `tests.vllm.ckpts.write_trained_target` (trained here in
seconds, margins of several logits), and the project's tiny target (`scripts/make_tiny_target.py`)
when its artifact is already built (it is never built here: that takes minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm.ckpts import chat_rows, write_trained_target

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
NUM_ROWS = 6


def project_tiny_target() -> Path | None:
    """The project's tiny target if built (env DSPARK_TINY_TARGET or artifacts/tiny-target)."""
    env = os.environ.get("DSPARK_TINY_TARGET")
    path = Path(env) if env else REPO / "artifacts" / "tiny-target"
    return path if (path / "config.json").exists() and (path / "tokenizer.json").exists() else None


def project_rows(target: Path, n: int) -> list[dict]:
    """First `n` chat rows of the target's own data (any *.jsonl with `messages`)."""
    rows = []
    for f in sorted((target / "data").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row.get("messages"):
                rows.append({"messages": row["messages"]})
            if len(rows) == n:
                return rows
    return rows


@pytest.fixture(scope="module", params=["word-level", "project-tiny-target"])
def target_and_rows(request, vllm_workdir):
    if request.param == "word-level":
        target = vllm_workdir / "trained_target"
        if not (target / "config.json").exists():
            write_trained_target(target)
        return target, chat_rows(NUM_ROWS, seed=1), 12
    target = project_tiny_target()
    if target is None:
        pytest.skip(
            "project tiny target not built (run `python scripts/make_tiny_target.py` or set "
            "DSPARK_TINY_TARGET); the word-level trained target still covers vLLM regeneration"
        )
    rows = project_rows(target, NUM_ROWS)
    if not rows:
        pytest.skip(f"{target}/data has no chat rows with `messages` to use as prompts")
    return target, rows, 24


def _answers(path: Path) -> dict[int, tuple[str, str]]:
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out[rec["row_index"]] = (rec["messages"][-1]["content"], rec["regen"]["finish_reason"])
    return out


def test_vllm_greedy_regeneration_matches_hf(target_and_rows, tmp_path):
    from train.data.regenerate import regenerate_responses

    target, rows, max_new = target_and_rows
    rows_file = tmp_path / "rows.json"
    rows_file.write_text(json.dumps(rows))
    out_vllm, out_hf = tmp_path / "vllm.jsonl", tmp_path / "hf.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "vllm_probe" / "regen_vllm.py"),
        str(target),
        str(rows_file),
        str(out_vllm),
        f"--max-new-tokens={max_new}",
    ]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"vLLM regeneration failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )

    sampling = {"temperature": 0.0, "max_new_tokens": max_new}
    regenerate_responses(
        rows, str(target), str(target), sampling, out_hf, batch_size=4, backend="hf"
    )

    vllm_ans, hf_ans = _answers(out_vllm), _answers(out_hf)
    assert sorted(vllm_ans) == sorted(hf_ans) == list(range(len(rows)))
    assert any(text.strip() for text, _ in hf_ans.values()), "HF produced only empty answers"
    diff = {i: (vllm_ans[i], hf_ans[i]) for i in hf_ans if vllm_ans[i] != hf_ans[i]}
    assert not diff, f"greedy answers differ (row: (vllm, hf)): {diff}"
    backends = {json.loads(line)["regen"]["backend"] for line in out_vllm.read_text().splitlines()}
    assert backends == {"vllm"}
