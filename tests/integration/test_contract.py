"""The vLLM checkpoint contract: every silent-failure case of docs/vllm-contract.md is rejected by
`check_checkpoint` and by `python -m serve.check` (exit 1, one `DIR: problem` line each)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.checkpoint import CONFIG_NAME, WEIGHTS_NAME, save_checkpoint
from common.contract import check_checkpoint
from serve import check as serve_check
from tests.conftest import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A valid canonical export: reduced vocab (d2t ships), vanilla Markov head, confidence head."""
    return save_checkpoint(tiny_model(draft_vocab_size=40), tmp_path_factory.mktemp("c") / "good")


def edit_config(d: Path, fn) -> None:
    raw = json.loads((d / CONFIG_NAME).read_text())
    fn(raw)
    (d / CONFIG_NAME).write_text(json.dumps(raw))


def edit_weights(d: Path, fn) -> None:
    tensors = load_file(str(d / WEIGHTS_NAME))
    tensors = fn(tensors) or tensors
    save_file(tensors, str(d / WEIGHTS_NAME))


def drop(*keys):
    return lambda t: {k: v for k, v in t.items() if k not in keys}


def setitem(key, fn):
    def edit(t):
        t[key] = fn(t[key])

    return edit


def d2t_not_increasing(d2t):
    d2t = d2t.clone()
    d2t[5] = d2t[4] - 1  # draft 5 maps to the same target id as draft 4
    return d2t


def d2t_out_of_range(d2t):
    d2t = d2t.clone()
    d2t[-1] += 1000
    return d2t


def flip_layout(raw):
    raw["sample_from_anchor"], raw["dspark_bonus_anchor"] = (
        raw["dspark_bonus_anchor"],
        raw["sample_from_anchor"],
    )


def flip_layout_and_count(raw):
    flip_layout(raw)
    raw["num_speculative_tokens"] = raw["block_size"] - 1  # consistent with the new keys


CASES = {
    "missing_d2t": (None, drop("d2t"), "missing tensor d2t"),
    "d2t_int32": (None, setitem("d2t", lambda x: x.to(torch.int32)), "d2t: dtype I32"),
    "d2t_out_of_range": (None, setitem("d2t", d2t_out_of_range), "outside [0, 96)"),
    "d2t_not_increasing": (None, setitem("d2t", d2t_not_increasing), "not strictly increasing"),
    "layout_keys_equal": (
        lambda r: r.update(dspark_bonus_anchor=True),
        None,
        "sample_from_anchor == dspark_bonus_anchor",
    ),
    "layout_keys_swapped": (flip_layout, None, "layout keys swapped"),
    "layout_keys_swapped_with_count": (flip_layout_and_count, None, "trained with"),
    "layout_key_missing": (lambda r: r.pop("dspark_bonus_anchor"), None, "lacks dspark_bonus"),
    "missing_markov": (
        None,
        drop("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"),
        "missing tensor markov_head.markov_w1.weight",
    ),
    "missing_confidence": (
        None,
        drop("confidence_head.proj.weight", "confidence_head.proj.bias"),
        "missing tensor confidence_head.proj.weight",
    ),
    "confidence_bf16": (
        None,
        setitem("confidence_head.proj.weight", lambda x: x.to(torch.bfloat16)),
        "confidence head must be float32",
    ),
    "model_prefix": (None, lambda t: {f"model.{k}": v for k, v in t.items()}, "'model.' prefix"),
    "lm_head_rows": (
        None,
        setitem("lm_head.weight", lambda x: x[:39].clone()),
        "lm_head.weight: shape (39, 32), expected (40, 32)",
    ),
    "lm_head_missing": (None, drop("lm_head.weight"), "missing tensor lm_head.weight"),
    "wrong_architectures": (
        lambda r: r.update(architectures=["DeepseekV4ForCausalLM"]),
        None,
        "Qwen3DSparkModel",
    ),
    "is_causal": (lambda r: r.update(is_causal=True), None, "is_causal"),
    "backbone_mixed_dtypes": (
        None,
        setitem("fc.weight", lambda x: x.float()),
        "backbone tensors mix dtypes",
    ),
}


def broken_copy(good: Path, tmp_path: Path, case: str) -> Path:
    d = tmp_path / case
    shutil.copytree(good, d)
    cfg_edit, w_edit, _ = CASES[case]
    if cfg_edit:
        edit_config(d, cfg_edit)
    if w_edit:
        edit_weights(d, w_edit)
    return d


def test_good_checkpoint_is_clean(good, capsys):
    assert check_checkpoint(good) == []
    assert check_checkpoint(good, require_vllm_servable=True) == []
    assert serve_check.main([str(good)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"{good}: OK"


@pytest.mark.parametrize("case", list(CASES))
def test_contract_violation_is_reported(good, tmp_path, capsys, case):
    d = broken_copy(good, tmp_path, case)
    expected = CASES[case][2]
    problems = check_checkpoint(d)
    assert any(expected in p for p in problems), problems
    assert serve_check.main([str(d)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith(f"{d}: ") for line in lines)
    assert any(expected in line for line in lines)


def test_speculators_layout_violations(tmp_path):
    good = save_checkpoint(tiny_model(), tmp_path / "spec", fmt="speculators", verifier="t")
    assert check_checkpoint(good) == []
    cases = {
        "no_sfa": (lambda r: r.pop("sample_from_anchor"), "sample_from_anchor missing"),
        "aux_ids": (lambda r: r.update(aux_hidden_state_layer_ids=[1, 3]), "disagree"),
        "tokens": (
            lambda r: r["speculators_config"]["proposal_methods"][0].update(speculative_tokens=3),
            "speculative_tokens=3",
        ),
        "algorithm": (lambda r: r["speculators_config"].update(algorithm="eagle3"), "'dspark'"),
    }
    for name, (edit, expected) in cases.items():
        d = tmp_path / name
        shutil.copytree(good, d)
        edit_config(d, edit)
        problems = check_checkpoint(d)
        assert any(expected in p for p in problems), (name, problems)


def test_vllm_flag_rejects_non_vanilla_heads(tmp_path):
    d = save_checkpoint(tiny_model(markov_head_type="rnn"), tmp_path / "rnn")
    assert check_checkpoint(d) == []
    assert any("stock vLLM serves only" in p for p in check_checkpoint(d, True))
    assert serve_check.main([str(d), "--vllm"]) == 1


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "serve.check", *map(str, args)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_subprocess_exit_codes(good, tmp_path):
    ok = run_cli(good)
    assert ok.returncode == 0, ok.stderr
    first, spec = ok.stdout.splitlines()
    assert first == f"{good}: OK" and spec.startswith("vLLM: --speculative-config ")
    # Several problems at once: one line each, exit 1.
    d = broken_copy(good, tmp_path, "missing_d2t")
    edit_config(d, flip_layout)
    bad = run_cli(d)
    assert bad.returncode == 1, bad.stderr
    lines = bad.stdout.splitlines()
    assert all(line.startswith(f"{d}: ") for line in lines)
    assert any("missing tensor d2t" in line for line in lines)
    assert any("layout keys swapped" in line for line in lines)
