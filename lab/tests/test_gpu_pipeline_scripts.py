"""The device pipelines (lab/gpu/*.stages, run by run_all.sh) and poll.sh, which brings their
results back: a stage naming a missing or broken script is found here, not after a machine's
minutes; a poll must return as many shipped parts as one device call brings back (8 files, 64 MiB
in all), no more (the call would fail), no fewer (a lost machine keeps the rest)."""

import io
import os
import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "lab" / "gpu"
STAGES = sorted(GPU.glob("*.stages"))
CALL_LIMIT = 64 * 1024 * 1024


def stage_lines(path: Path) -> list[list[str]]:
    lines = (ln.split() for ln in path.read_text().splitlines())
    return [ln for ln in lines if ln and not ln[0].startswith("#")]


@pytest.mark.parametrize("stages", STAGES, ids=lambda p: p.stem)
def test_every_stage_names_a_script_that_parses(stages):
    lines = stage_lines(stages)
    assert lines, f"{stages.name}: no stages"
    names = [ln[0] for ln in lines]
    assert len(set(names)) == len(names), f"{stages.name}: a stage name repeats: {names}"
    for name, script, *_ in lines:
        path = GPU / script
        assert path.is_file(), f"{stages.name}: stage {name} runs {script}: not in lab/gpu"
        subprocess.run(["bash", "-n", str(path)], check=True)


DISTILL_STAGES = [  # (stages file, experiments, overrides) of every smollm2_distill.sh stage
    (
        path.stem,
        [a for a in args if "=" not in a] or ["smollm2_dspark", "smollm2_dflash"],
        [a for a in args if "=" in a],
    )
    for path in STAGES
    for _, script, *args in stage_lines(path)
    if script == "smollm2_distill.sh"
]


@pytest.mark.parametrize(
    "stages,experiments,overrides", DISTILL_STAGES, ids=[d[0] for d in DISTILL_STAGES]
)
def test_every_distill_stage_composes_its_experiments_and_overrides(stages, experiments, overrides):
    """A misspelt experiment or override would cost a device session's minutes, not a test's."""
    from lab import SEARCHPATH
    from train.config_io import compose_config

    for name in experiments:
        cfg = compose_config([SEARCHPATH, f"+experiment={name}", *overrides])
        assert cfg.experiment_name == name, f"{stages}: {name} names itself {cfg.experiment_name}"


def run_poll(res: Path, out: Path, seconds: int = 1, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(GPU / "poll.sh"), *flags, str(seconds)],
        env={"RES": str(res), "OUT": str(out), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


def poll(res: Path, out: Path, *flags: str) -> list[str]:
    assert run_poll(res, out, 1, *flags).returncode == 0
    return sorted(p.name for p in out.iterdir())


def finished_with_parts(tmp_path: Path, parts: list[str]) -> Path:
    res = tmp_path / "res"
    (res / "ship").mkdir(parents=True)
    (res / "DONE").touch()
    (res / "stages.txt").write_text("12:00:00 start distill\n")
    for name in parts:  # sparse files: their size is what the budget reads
        with open(res / "ship" / name, "wb") as f:
            f.truncate(15_000_000)
    (res / "ship" / "SHA256SUMS").write_text("sums\n")
    return res


def test_poll_returns_as_many_parts_as_one_call_carries_back(tmp_path):
    parts = [f"draft.tgz.0{i}" for i in range(6)]
    res = finished_with_parts(tmp_path, parts)

    first = poll(res, tmp_path / "out1")
    assert first == sorted(["SHA256SUMS", "results.tgz", *parts[:4]])
    sent = sum(p.stat().st_size for p in (tmp_path / "out1").iterdir())
    assert sent <= CALL_LIMIT
    assert poll(res, tmp_path / "out2") == sorted(["SHA256SUMS", "results.tgz", *parts[4:]])
    assert poll(res, tmp_path / "out3") == ["SHA256SUMS", "results.tgz"]


def test_a_resend_poll_returns_the_previous_polls_parts_again(tmp_path):
    """The device tool can fail to copy a call's files back; the parts that poll marked sent
    must be fetchable again, and only those (a poll that had nothing new keeps the mark)."""
    parts = [f"draft.tgz.0{i}" for i in range(6)]
    res = finished_with_parts(tmp_path, parts)
    assert poll(res, tmp_path / "out1") == sorted(["SHA256SUMS", "results.tgz", *parts[:4]])
    assert poll(res, tmp_path / "out2") == sorted(["SHA256SUMS", "results.tgz", *parts[4:]])
    assert poll(res, tmp_path / "out3") == ["SHA256SUMS", "results.tgz"]
    resent = poll(res, tmp_path / "out4", "--resend")
    assert resent == sorted(["SHA256SUMS", "results.tgz", *parts[4:]])
    assert poll(res, tmp_path / "out5") == ["SHA256SUMS", "results.tgz"]


def test_a_poll_with_no_pipeline_returns_at_once_and_says_so(tmp_path):
    """The call that starts a pipeline can fail to get a machine while the next calls get a fresh
    one: a poll there must not wait out its minutes of device time for a pipeline that never ran."""
    res = tmp_path / "res"
    res.mkdir()
    started = time.monotonic()
    done = run_poll(res, tmp_path / "out", seconds=60)
    assert time.monotonic() - started < 20
    assert done.returncode == 3
    assert "no pipeline was started" in done.stdout
    assert (tmp_path / "out" / "results.tgz").exists()  # what there is still comes back


def test_a_poll_returns_at_once_when_its_pipeline_died(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (res / "pipeline.pid").write_text(f"{dead.pid}\n")
    started = time.monotonic()
    done = run_poll(res, tmp_path / "out", seconds=60)
    assert time.monotonic() - started < 20
    assert done.returncode == 3 and "stopped before DONE" in done.stdout


def test_a_poll_waits_while_its_pipeline_runs(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    with subprocess.Popen(["sleep", "30"]) as alive:
        (res / "pipeline.pid").write_text(f"{alive.pid}\n")
        started = time.monotonic()
        done = run_poll(res, tmp_path / "out", seconds=3)
        waited = time.monotonic() - started
        alive.kill()
    assert waited >= 3 and done.returncode == 0, done.stdout


def unpack_draft(tmp_path: Path, members: dict[str, bytes]) -> subprocess.CompletedProcess:
    """draft_from_archive.sh on an archive of MEMBERS (path -> bytes) in a stand-in carry folder."""
    carry = tmp_path / "carry"
    carry.mkdir()
    with tarfile.open(carry / "d.tgz", "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    env = dict(os.environ, CARRY_DIR=str(carry), OUT=str(tmp_path / "out"))
    return subprocess.run(
        ["bash", str(GPU / "draft_from_archive.sh"), "d.tgz", str(tmp_path / "draft")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_carried_draft_archive_unpacks_where_init_from_and_serving_read_it(tmp_path):
    done = unpack_draft(tmp_path, {"final/config.json": b"{}", "final/model.safetensors": b"w"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "draft" / "final" / "model.safetensors").read_bytes() == b"w"


@pytest.mark.parametrize(
    "members, why",
    [
        ({"final/config.json": b"{}", "other/x": b"x"}, "more than a final/ folder"),
        ({"final/config.json": b"{}"}, "no final/config.json and final/model.safetensors"),
    ],
)
def test_a_draft_archive_of_the_wrong_shape_is_refused_by_name(tmp_path, members, why):
    done = unpack_draft(tmp_path, members)
    assert done.returncode == 1 and why in done.stderr


TOOLCHAIN_VARIABLES = (
    "CC",
    "CXX",
    "CPP",
    "LD",
    "AR",
    "AS",
    "NM",
    "CFLAGS",
    "CXXFLAGS",
    "LDFLAGS",
    "CPATH",
    "LIBRARY_PATH",
    "LD_LIBRARY_PATH",
    "PATH",
    "TMPDIR",
    "HOME",
)


@pytest.mark.parametrize("script", sorted(GPU.glob("*.sh")), ids=lambda p: p.name)
def test_no_device_script_reuses_a_variable_the_environment_exports(script):
    """A plain `CC=...` in a script changes the exported compiler its children see: on 2026-12-05
    the distill stage's compile-cache path was named CC, the device exports CC for Triton's C
    helpers, and the stage failed running the cache file as gcc."""
    assign = re.compile(r"(?:^|[\s;(&|])(" + "|".join(TOOLCHAIN_VARIABLES) + r")=")
    for n, line in enumerate(script.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        assert not assign.search(code), f"{script.name}:{n} assigns {assign.search(code)[1]}"


def run_script(tmp_path, script: str, *args: str) -> subprocess.CompletedProcess:
    """lab/gpu/SCRIPT ARGS..., its $OUT under tmp_path."""
    return subprocess.run(
        ["bash", str(GPU / script), *args],
        env=dict(os.environ, OUT=str(tmp_path / "out")),
        capture_output=True,
        text=True,
        timeout=60,
    )


def serve(tmp_path, drafts):
    """smollm2_serve.sh up to its choice of draft: series 9.9 is refused right after it, before
    any vLLM is waited for."""
    return run_script(tmp_path, "smollm2_serve.sh", "9.9", drafts)


def test_serving_takes_the_first_of_its_drafts_that_holds_a_checkpoint(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    for d in (b, c):
        d.mkdir()
        (d / "config.json").write_text("{}")
    done = serve(tmp_path, f"{a},{b},{c}")
    assert f"no checkpoint at {a}; using {b}" in done.stderr
    assert done.returncode == 2 and "usage" in done.stderr  # past the choice, at the series
    done = serve(tmp_path, f"{b},{c}")
    assert "using" not in done.stderr and done.returncode == 2
    done = serve(tmp_path, f"{a},{tmp_path / 'x'}")
    assert done.returncode == 2 and f"no draft checkpoint at {a} or {tmp_path / 'x'}" in done.stderr


def test_the_gate_takes_the_first_of_its_drafts_that_holds_a_checkpoint(tmp_path):
    """smollm2_gate.sh up to its choice of draft (a wrong third argument is refused right after
    it): a missing draft would otherwise send vllm_gate.sh off to train a small one."""
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    (b / "config.json").write_text("{}")

    def gate(drafts):
        return run_script(tmp_path, "smollm2_gate.sh", "0.26", "8", "neither", drafts)

    done = gate(f"{a},{b}")
    assert f"no checkpoint at {a}; using {b}" in done.stderr and "third argument" in done.stderr
    done = gate(str(a))
    assert done.returncode == 2 and f"no draft checkpoint at {a}" in done.stderr
    assert "third argument" not in done.stderr


def evaluate_command(tmp_path, *args: str) -> str:
    """The eval_acceptance.py command line smollm2_evaluate.sh builds from ARGS (python3 stubbed
    to print its arguments; `python3 -m` fails, so env.sh installs no carried wheel)."""
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text('#!/bin/sh\n[ "$1" = -m ] && exit 1\necho "python3 $*"\n')
    stub.chmod(0o755)
    done = subprocess.run(
        ["bash", str(GPU / "smollm2_evaluate.sh"), *args],
        env=dict(os.environ, OUT=str(tmp_path / "out"), PATH=f"{stub.parent}:{os.environ['PATH']}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return next(ln for ln in done.stdout.splitlines() if "eval_acceptance.py" in ln)


def test_the_evaluation_takes_its_temperatures_then_its_prompt_sets(tmp_path):
    """--temperatures stops at the next option: it once swallowed `--domain` as a temperature."""
    draft = tmp_path / "d"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    cmd = evaluate_command(
        tmp_path,
        "--temperatures",
        "0",
        "--domain",
        "a=x.jsonl",
        "--domain",
        "b=y.jsonl",
        f"dspark={draft}",
    )
    assert "--prompts a=x.jsonl b=y.jsonl --temperatures 0 --num-prompts" in cmd
    assert f"--draft=dspark={draft}" in cmd and "smollm2_dspark.json" in cmd
    cmd = evaluate_command(tmp_path, "--temperatures", "0", "1", f"dspark={draft}")
    assert "humaneval=artifacts/smollm2-data/humaneval-heldout.jsonl --temperatures 0 1 " in cmd
    assert "--prompts sharegpt=artifacts/smollm2-data/sharegpt-heldout.jsonl" in cmd


def test_the_mix_names_the_first_sharegpt_prompts_its_drafts_read(tmp_path):
    """--read N: the first N ShareGPT train prompts whose rows the mix holds, in the file's
    order; one the regeneration left out (a, c) is skipped, so an evaluation on them meets no
    unread one."""
    import json

    def write(name, ids):
        rows = [{"id": i, "messages": [{"role": "user", "content": i}]} for i in ids]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("sharegpt-train.jsonl", ["a", "b", "c", "d", "e"])
    write("train.greedy.jsonl", ["e", "pystdlib/x", "b", "d"])
    sources = ["train.greedy.jsonl", "train.none.jsonl"]
    done = subprocess.run(
        ["bash", str(GPU / "smollm2_mix.sh"), "--read", "2", *sources],
        env=dict(os.environ, SMOLLM2_DATA=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "no rows in" in done.stderr and "train.none.jsonl, left out" in done.stderr
    read = [json.loads(ln)["id"] for ln in (tmp_path / "sharegpt-read.jsonl").open()]
    assert read == ["b", "d"] and "2 prompts the drafts read (2 unread skipped)" in done.stdout
    assert len((tmp_path / "train.mix.jsonl").read_text().splitlines()) == 4
