"""train/loop/compile_cache.py: torch.compile's artifacts written by one process load in a fresh one
(a fresh inductor cache folder, as on a new machine) and turn its compiles into cache hits; a
missing or unreadable file never stops a run."""

import json
import os
import subprocess
import sys
from pathlib import Path

from torch.compiler._cache import CacheArtifactManager

from tests.integration.test_distill import fast
from train.distill import main
from train.loop.compile_cache import load_compile_cache, save_compile_cache

ROOT = Path(__file__).resolve().parents[2]
COMPILE = """
import json, sys, torch
from torch._dynamo.utils import counters
from train.loop.compile_cache import load_compile_cache, save_compile_cache
path, mode = sys.argv[1], sys.argv[2]
if mode == "load":
    print(load_compile_cache(path))
f = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU()))
f(torch.randn(4, 8)).sum().backward()
if mode == "save":
    print(save_compile_cache(path))
print(json.dumps(dict(counters["inductor"])))
"""


def compile_in_fresh_process(path: Path, mode: str, cache_dir: Path) -> tuple[str, dict]:
    # TORCHINDUCTOR_VEC_ISA_OK=1: inductor takes the vector ISA the CPU flags name instead of
    # proving it by compiling and loading a probe library per ISA, which it redoes in every fresh
    # cache folder (about 10 s of g++ per process here, none of it ours to test).
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "TORCHINDUCTOR_VEC_ISA_OK": "1",
        "PYTHONPATH": str(ROOT),
    }
    out = (
        subprocess.run(
            [sys.executable, "-c", COMPILE, str(path), mode],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        .stdout.strip()
        .splitlines()
    )
    return out[0], json.loads(out[-1])


def test_artifacts_of_one_process_are_cache_hits_in_a_fresh_one(tmp_path):
    path = tmp_path / "cache" / "compile_cache.bin"
    said, first = compile_in_fresh_process(path, "save", tmp_path / "inductor_a")
    assert "artifacts written" in said and path.is_file()
    assert first.get("fxgraph_cache_miss", 0) > 0 and not first.get("fxgraph_cache_hit")
    said, second = compile_in_fresh_process(path, "load", tmp_path / "inductor_b")
    assert "artifacts loaded" in said
    assert second.get("fxgraph_cache_hit", 0) == first["fxgraph_cache_miss"]
    assert not second.get("fxgraph_cache_miss")


def test_a_missing_or_unreadable_file_is_reported_and_passed_over(tmp_path):
    assert "none yet" in load_compile_cache(tmp_path / "absent.bin")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a cache")
    assert "not loaded" in load_compile_cache(bad)


def test_a_cpu_run_with_a_compile_cache_trains_and_says_what_it_kept(target, tmp_path, capsys):  # noqa: F811
    """Nothing compiles in a CPU run (the compile settings are GPU only): the run says so and
    writes no file, and trains as without the setting."""
    path = tmp_path / "cc.bin"
    # As in a fresh `python -m train.distill`: torch records the artifacts of every compile of its
    # process, and a test that ran torch.compile earlier in this one (whatever the order) must not
    # count as this run's.
    with CacheArtifactManager.with_fresh_cache():
        assert main(fast(target, tmp_path / "run", f"trainer.compile_cache={path}")) == 0
    text = capsys.readouterr().out
    assert "none yet" in text and "nothing compiled, not written" in text
    assert not path.exists() and not save_compile_cache(path).endswith("written)")
