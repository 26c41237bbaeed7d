"""Response regeneration (`train.data.regenerate.regenerate_responses`) with real `vllm.LLM` on CPU
gives the same greedy answers as the HF backend.

vLLM runs in its own process (`scripts/vllm_probe/regen_vllm.py`): `vllm.LLM` starts an engine
core with its own distributed state, which must not meet the vLLM modules other tests build in
this process. Greedy equality is only meaningful when top-1 margins are wide, so the main target is
trained: the word-level target of `tests.tiny.write_trained_target` (trained here in seconds,
top-1 margins of several logits). The project's tiny target (`scripts/make_tiny_target.py`) is
used too when already built (never built here: minutes); it is weakly trained, with near-ties.

Both backends run the checkpoint's own dtype (`test_backends_run_the_same_dtype`): vLLM's
"auto" alone would run a float32 checkpoint in bfloat16, and near-ties would then differ.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import word_chat_rows, write_trained_target

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


def _answers(path: Path) -> dict[int, tuple[str, str]]:
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        assert rec["regen"]["temperature"] == 0.0
        out[rec["row_index"]] = (rec["messages"][-1]["content"], rec["regen"]["finish_reason"])
    return out


def regenerate_both(target: Path, rows: list[dict], max_new: int, work: Path) -> dict:
    """Run regenerate_responses with backend="vllm" (subprocess) and backend="hf" (here)."""
    from transformers import AutoConfig

    from train.data.regenerate import regenerate_responses

    work.mkdir(parents=True, exist_ok=True)
    rows_file = work / "rows.json"
    rows_file.write_text(json.dumps(rows))
    out_vllm, out_hf = work / "vllm.jsonl", work / "hf.jsonl"
    # The repo first, then the parent's own PYTHONPATH: where vLLM and our dependencies come from
    # PYTHONPATH (the GPU scripts put vLLM 0.34 and carried wheels such as `datasets` there), a
    # PYTHONPATH of the repo alone loses them in the child.
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    script = REPO / "scripts" / "vllm_probe" / "regen_vllm.py"
    cmd = [sys.executable, str(script), str(target), str(rows_file), str(out_vllm)]
    proc = subprocess.run(
        [*cmd, f"--max-new-tokens={max_new}"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"vLLM regeneration failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    vllm_dtype = re.search(r"regen_vllm: dtype=(\S+)", proc.stdout).group(1)

    sampling = {"temperature": 0.0, "max_new_tokens": max_new}
    regenerate_responses(rows, str(target), str(target), sampling, out_hf, backend="hf")
    backends = {json.loads(line)["regen"]["backend"] for line in out_vllm.read_text().splitlines()}
    assert backends == {"vllm"}
    return {
        "vllm": _answers(out_vllm),
        "hf": _answers(out_hf),
        "vllm_dtype": vllm_dtype,
        "hf_dtype": str(AutoConfig.from_pretrained(target).dtype),  # HFGenerator: dtype="auto"
        "rows": len(rows),
    }


def differing(run: dict) -> dict:
    vllm, hf = run["vllm"], run["hf"]
    assert sorted(vllm) == sorted(hf) == list(range(run["rows"]))
    assert any(text.strip() for text, _ in hf.values()), "HF produced only empty answers"
    return {i: {"vllm": vllm[i], "hf": hf[i]} for i in hf if vllm[i] != hf[i]}


@pytest.fixture(scope="module")
def word_level_run(vllm_workdir):
    target = vllm_workdir / "trained_target"
    if not (target / "config.json").exists():
        write_trained_target(target)
    rows = word_chat_rows(NUM_ROWS, seed=1)
    return regenerate_both(target, rows, 12, vllm_workdir / "regen_word")


def test_vllm_greedy_regeneration_matches_hf(word_level_run):
    diff = differing(word_level_run)
    assert not diff, f"greedy answers differ: {diff}"
    assert all(finish == "stop" for _, finish in word_level_run["hf"].values())


def test_backends_run_the_same_dtype(word_level_run):
    """VLLMGenerator passes the checkpoint's dtype: vLLM's "auto" would run fp32 in bf16."""
    assert word_level_run["vllm_dtype"] == word_level_run["hf_dtype"]


def test_project_tiny_target_regeneration(vllm_workdir):
    target = project_tiny_target()
    if target is None:
        pytest.skip(
            "project tiny target not built (run `python scripts/make_tiny_target.py` or set "
            "DSPARK_TINY_TARGET); the word-level trained target still covers vLLM regeneration"
        )
    rows = project_rows(target, NUM_ROWS)
    if not rows:
        pytest.skip(f"{target}/data has no chat rows with `messages` to use as prompts")
    run = regenerate_both(target, rows, 24, vllm_workdir / "regen_project")
    diff = differing(run)
    assert run["vllm_dtype"] == run["hf_dtype"]
    assert not diff, f"greedy answers differ with both backends in {run['hf_dtype']}: {diff}"
