"""The launcher sizes vLLM's CUDA-graph capture to the widest verify batch, max_num_seqs x (N+1)
tokens, when vLLM's default ceiling (512) is narrower, and leaves a user's own capture setting
alone (serve.vllm_args.decide_cudagraph_capture_size and the argv it goes into)."""

from __future__ import annotations

import json

import pytest

from serve.launch_config import ServeCfg
from serve.launch_vllm import vllm_launch
from serve.vllm_args import build_vllm_command, decide_cudagraph_capture_size
from tests.tiny import tiny_config

SPEC = {"method": "dspark", "model": "/ckpt", "num_speculative_tokens": 7}


def naive_capture(seqs: int, n: int) -> int | None:
    """The rule written out: tokens of the widest verify batch, the next multiple of 16 at or
    above it, nothing when 512 already covers it."""
    tokens = seqs * (n + 1)
    if tokens <= 512:
        return None
    size = tokens
    while size % 16:
        size += 1
    return size


@pytest.mark.parametrize(
    "seqs, n, expected",
    [(128, 7, 1024), (64, 7, None), (65, 7, 528), (100, 4, None), (300, 3, 1200)],
)
def test_capture_covers_max_num_seqs_times_n_plus_1(seqs, n, expected):
    size, notes = decide_cudagraph_capture_size(seqs, n)
    assert size == expected == naive_capture(seqs, n)
    if size is not None:
        assert size >= seqs * (n + 1) and f"= {seqs * (n + 1)} tokens" in notes[0]
    else:
        assert notes == []


def test_capture_defaults_and_when_there_is_nothing_to_size():
    size, notes = decide_cudagraph_capture_size(None, 7)  # vLLM's default max_num_seqs, 256
    assert size == 2048 and "(vLLM's default)" in notes[0]
    assert decide_cudagraph_capture_size(128, None) == (None, [])  # no draft: no verify batch
    assert decide_cudagraph_capture_size(128, 7, enforce_eager=True) == (None, [])  # no graphs


@pytest.mark.parametrize(
    "extra",
    [
        ["--max-cudagraph-capture-size", "4096"],
        ["--cudagraph-capture-sizes", "1", "2"],
        ["--compilation-config", '{"max_cudagraph_capture_size": 256}'],
        ['-cc={"cudagraph_capture_sizes": [1, 8]}'],
        ["-cc.max_cudagraph_capture_size=2048"],
        ["-O3"],  # a form we do not rewrite: left to the user
        ["--compilation-config", "not json"],
    ],
)
def test_a_user_capture_setting_wins(extra):
    size, notes = decide_cudagraph_capture_size(128, 7, extra_args=extra)
    assert size is None and "as extra_vllm_args set them" in notes[0]
    cfg = ServeCfg(target="t", checkpoint="/ckpt", max_num_seqs=128, extra_vllm_args=extra)
    cmd = build_vllm_command(cfg, SPEC, cudagraph_capture_size=size)
    assert cmd[-len(extra) :] == extra and cmd.count("--compilation-config") <= 1


def test_the_size_joins_the_users_compilation_config():
    for extra, flag_at in (
        (["--compilation-config", '{"mode": 3}', "--gpu-memory-utilization", "0.8"], 1),
        (['--compilation-config={"mode": 3}'], 0),
    ):
        assert decide_cudagraph_capture_size(128, 7, extra_args=extra)[0] == 1024
        cfg = ServeCfg(target="t", checkpoint="/ckpt", extra_vllm_args=extra)
        cmd = build_vllm_command(cfg, SPEC, cudagraph_capture_size=1024)
        assert (
            cmd.count("--compilation-config") + sum("--compilation-config=" in a for a in cmd) == 1
        )
        arg = cmd[len(cmd) - len(extra) + flag_at]
        assert json.loads(arg.split("=", 1)[1] if arg.startswith("--") else arg) == {
            "mode": 3,
            "max_cudagraph_capture_size": 1024,
        }
    cmd = build_vllm_command(ServeCfg(target="t"), SPEC, cudagraph_capture_size=1024)
    assert cmd[-2:] == ["--compilation-config", '{"max_cudagraph_capture_size":1024}']


def test_the_launch_passes_the_size(tmp_path):
    """End to end through the vLLM branch's decisions: a 1+N draft of block 8 (N = 7) at
    max_num_seqs=128 gets graphs to 1024 tokens; at 64 (512 tokens) vLLM's default is kept."""
    draft = tiny_config(block_size=8, sample_from_anchor=False)
    cfg = ServeCfg(target="t", checkpoint=str(tmp_path), max_num_seqs=128)
    cmd, notes = vllm_launch(cfg, draft, "0.34.0")
    assert json.loads(cmd[cmd.index("--compilation-config") + 1]) == {
        "max_cudagraph_capture_size": 1024
    }
    assert any("max_cudagraph_capture_size=1024" in n for n in notes)
    cfg.max_num_seqs = 64
    cmd, _ = vllm_launch(cfg, draft, "0.34.0")
    assert "--compilation-config" not in cmd
    cfg.enforce_eager = True
    cfg.max_num_seqs = 128
    assert "--compilation-config" not in vllm_launch(cfg, draft, "0.34.0")[0]
