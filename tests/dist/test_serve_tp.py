"""The serving entry points' `--tp` and `--use-fp64-gumbel`: parsed into `EngineOptions`, tp > 1
refused without a torch.distributed world, and `python -m serve.api --tp 2` run as torchrun
would (two processes, gloo) answering HTTP bit-identically to a one-process engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import serve.api.__main__ as api_main
from serve.engine import Engine, EngineOptions, SamplingParams
from serve.engine.lockstep import TORCHRUN_ENV
from tests.dist.sharded_walk_check import free_port
from tests.unit.test_engine_helpers import (
    make_draft,
    make_target,
    save_draft,
    save_target,
    wait_healthy,
)

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120
PROMPTS = [[5, 7, 9], [11, 12, 13, 14, 15], [20], [30, 31, 32, 33], [40, 41]]
MAX_TOKENS = [13, 9, 17, 12, 15]
TEMPERATURES = [1.0, 0.7, 1.0, 1.3, 0.0]


def test_serve_api_parses_tp_and_fp64_gumbel(monkeypatch):
    got = {}
    monkeypatch.setattr(api_main, "run_server", lambda opts, *a, **kw: got.update(opts=opts))
    assert api_main.main(["--target", "t", "--tp", "3", "--use-fp64-gumbel"]) == 0
    assert got["opts"] == EngineOptions(target="t", tp=3, use_fp64_gumbel=True)
    assert api_main.main(["--target", "t"]) == 0
    assert got["opts"].tp == 1 and got["opts"].use_fp64_gumbel is False
    assert api_main.main(["--target", "t", "--tp", "0"]) == 2


def test_serve_api_takes_the_adaptive_policy_and_its_tables(monkeypatch, capsys):
    """An SPS table prices the paper's Algorithm 1 only: reachable with --adaptive-policy
    algorithm1; with vLLM's policy it is refused (exit 2) and the message names the fix."""
    got = {}
    monkeypatch.setattr(api_main, "run_server", lambda opts, *a, **kw: got.update(opts=opts))
    base = ["--target", "t", "--checkpoint", "c", "--adaptive-verification"]
    assert api_main.main([*base, "--adaptive-policy", "algorithm1", "--sps-table", "s.json"]) == 0
    assert (got["opts"].adaptive_policy, got["opts"].sps_table) == ("algorithm1", "s.json")
    assert api_main.main([*base, "--cost-table", "c.json"]) == 0
    assert (got["opts"].adaptive_policy, got["opts"].cost_table) == ("vllm", "c.json")
    got.clear()
    assert api_main.main([*base, "--sps-table", "s.json"]) == 2
    assert not got and "adaptive_policy='algorithm1'" in capsys.readouterr().err


def test_serve_api_takes_the_budget_confidence(monkeypatch, capsys):
    got = {}
    monkeypatch.setattr(api_main, "run_server", lambda opts, *a, **kw: got.update(opts=opts))
    base = ["--target", "t", "--checkpoint", "c", "--adaptive-verification"]
    assert api_main.main(base) == 0 and got["opts"].adaptive_budget_confidence == "current"
    assert api_main.main([*base, "--adaptive-budget-confidence", "previous"]) == 0
    assert got["opts"].adaptive_budget_confidence == "previous"
    got.clear()
    bad = ["--adaptive-policy", "algorithm1", "--adaptive-budget-confidence", "previous"]
    assert api_main.main([*base, *bad]) == 2
    assert not got and "adaptive_policy='vllm'" in capsys.readouterr().err


def test_tp_without_a_world_exits_2_and_says_torchrun(monkeypatch, capsys):
    """Refused before any model is loaded (the target does not exist)."""
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    assert api_main.main(["--target", "/nonexistent", "--tp", "2"]) == 2
    err = capsys.readouterr().err
    assert "torchrun --nproc-per-node 2" in err and "RANK" in err
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert api_main.main(["--target", "/nonexistent", "--tp", "2"]) == 2
    assert "WORLD_SIZE=3" in capsys.readouterr().err


def drive(engine, params) -> dict[str, list[int]]:
    """Adds, an abort after the first step and a late add, then steps to the end: the calls
    rank 0's server makes, in an order that needs the followers to replay each one."""
    out: dict[str, list[int]] = {}
    for i in range(4):
        engine.add_request(PROMPTS[i], params[i], f"r{i}")
    steps = 0
    while engine.has_unfinished() or steps == 0:
        if steps == 1:
            engine.abort_request("r1")
            engine.add_request(PROMPTS[4], params[4], "r4")
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        steps += 1
    return out


def _lockstep_worker(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    from serve.engine.lockstep import Lockstep, follow

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        target = make_target(2)
        draft = make_draft(target, True, 40, seed=11, strength=2.0)
        params = [
            SamplingParams(max_tokens=m, temperature=t, seed=7 * i, ignore_eos=True)
            for i, (m, t) in enumerate(zip(MAX_TOKENS, TEMPERATURES, strict=True))
        ]
        kw = dict(target="<memory>", checkpoint="<memory>", dtype="float64", max_num_seqs=3)
        engine = Engine(target, draft, EngineOptions(**kw, tp=2), eos_token_ids=[])
        assert engine.sampler.group is not None
        if rank > 0:
            assert follow(engine) > 0
            return
        lockstep = Lockstep(engine)
        got = drive(lockstep, params)
        lockstep.close()
        ref = drive(Engine(target, draft, EngineOptions(**kw), eos_token_ids=[]), params)
        assert got == ref and got["r1"] != [] and len(got["r4"]) == MAX_TOKENS[4]
        assert engine.sampler.sharded_rounds > 0
    finally:
        dist.destroy_process_group()


def test_lockstep_replays_adds_and_aborts_on_the_follower():
    import torch.multiprocessing as mp

    mp.start_processes(
        _lockstep_worker, args=(free_port(),), nprocs=2, join=True, start_method="fork"
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_tp")
    target = make_target(2)
    save_target(target, root / "target")
    save_draft(make_draft(target, True, None, seed=10, strength=2.0), root / "draft")
    return root


def engine_args(root: Path) -> dict:
    return dict(target=str(root / "target"), checkpoint=str(root / "draft"), dtype="float64")


def test_serve_api_tp2_under_torchrun_env_equals_one_process(models, torch_single_thread):
    """Two `python -m serve.api --tp 2` processes with torchrun's variables: rank 0 answers
    concurrent sampled requests with the tokens a tp=1 engine gives; rank 1 follows every step
    and exits 0 when rank 0 is interrupted."""
    port, master = free_port(), free_port()
    cmd = [sys.executable, "-m", "serve.api", "--port", str(port), "--tp", "2"]
    cmd += ["--target", str(models / "target"), "--checkpoint", str(models / "draft")]
    cmd += ["--dtype", "float64", "--max-num-seqs", "4", "--max-model-len", "64"]
    procs, logs = [], []
    for rank in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        env |= {"PYTHONPATH": str(REPO), "RANK": str(rank), "LOCAL_RANK": str(rank)}
        env |= {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master)}
        logs.append(models / f"rank{rank}.log")
        with open(logs[-1], "w") as log:
            procs.append(
                subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
    base = f"http://127.0.0.1:{port}"

    def tail(rank: int) -> str:
        return logs[rank].read_text()[-3000:]

    try:
        wait_healthy(base, procs, tail, STARTUP_TIMEOUT_S, poll_s=0.3)

        def ask(i: int) -> list[int]:
            body = {"prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i], "seed": 100 + i}
            body |= {"temperature": TEMPERATURES[i], "ignore_eos": True, "return_token_ids": True}
            r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["token_ids"]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(ask, range(len(PROMPTS))))
        procs[0].send_signal(signal.SIGINT)
        codes = [p.wait(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert codes == [0, 0], f"exit codes {codes}\n{tail(0)}\n{tail(1)}"
    assert "batch-sharded across 2 ranks" in tail(0), tail(0)
    assert "rank 1: rank 0 closed after" in tail(1), tail(1)

    ref = Engine.from_options(
        EngineOptions(**engine_args(models), max_num_seqs=4, max_model_len=64)
    )
    params = [
        SamplingParams(max_tokens=m, temperature=t, seed=100 + i, ignore_eos=True)
        for i, (m, t) in enumerate(zip(MAX_TOKENS, TEMPERATURES, strict=True))
    ]
    assert got == ref.generate(PROMPTS, params)
