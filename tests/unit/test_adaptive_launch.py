"""What the launcher does around adaptive verification: it warns when the engine will read a raw
(uncalibrated) confidence head, and under vLLM it profiles the draft budget's cost table without
fabricated KV context (vLLM 0.34 prices every verified token with a whole request's context read
by default, and cuts drafts that would pay)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from common.sampling.calibration import folded_temperature
from serve.launch_config import ServeCfg, decide_adaptive_verification
from serve.launch_embedded import embedded_options
from serve.launch_vllm import vllm_env, vllm_launch
from tests.tiny import tiny_config

# The names as written by hand, not imported: the metadata key of the checkpoints already
# published with a folded temperature, and vLLM 0.34's environment variable.
FOLDED_KEY = "dspark_folded_confidence_temperature"
PROFILE_ENV = "VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN"
VLLM034_WHEEL = (
    Path.home() / ".cache/dspark/v34/wheels/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
)


def write_weights(ckpt: Path, folded: float | None) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    meta = {} if folded is None else {FOLDED_KEY: repr(folded)}
    save_file({"confidence_head.proj.bias": torch.zeros(1)}, str(ckpt / "model.safetensors"), meta)


def warned(notes: list[str]) -> bool:
    return any(n.startswith("warning") and "not calibrated" in n for n in notes)


def test_folded_temperature_reads_the_weights_metadata(tmp_path):
    write_weights(tmp_path / "raw", None)
    write_weights(tmp_path / "folded", 2.5)
    assert folded_temperature(tmp_path / "raw" / "model.safetensors") is None
    assert folded_temperature(tmp_path / "folded" / "model.safetensors") == 2.5


def test_uncalibrated_head_is_warned_not_refused():
    draft = tiny_config()
    on, notes = decide_adaptive_verification(True, draft, calibrated=False)
    assert on is True and warned(notes)
    for calibrated in (True, None):
        on, notes = decide_adaptive_verification(True, draft, calibrated=calibrated)
        assert on is True and not warned(notes)
    assert not warned(decide_adaptive_verification(False, draft, calibrated=False)[1])


def test_vllm_launch_checks_the_folded_temperature(tmp_path):
    draft = tiny_config()
    for name, folded, expect_warning in (("raw", None, True), ("folded", 1.7, False)):
        write_weights(tmp_path / name, folded)
        cfg = ServeCfg(target="t", checkpoint=str(tmp_path / name), adaptive_verification=True)
        _, notes = vllm_launch(cfg, draft, "0.34.0")
        assert warned(notes) is expect_warning, (name, notes)


def test_embedded_launch_checks_the_calibration_file(tmp_path):
    draft = tiny_config()
    cfg = ServeCfg(target="t", checkpoint=str(tmp_path), adaptive_verification=True)
    assert warned(embedded_options(cfg, draft, 0)[1])
    (tmp_path / "confidence_calibration.json").write_text(json.dumps({"temperatures": [1.0]}))
    assert not warned(embedded_options(cfg, draft, 0)[1])


def test_vllm_env_profiles_without_context_when_adaptive(tmp_path):
    draft = tiny_config()
    cfg = ServeCfg(target="t", checkpoint=str(tmp_path), adaptive_verification=True)
    cmd, _ = vllm_launch(cfg, draft, "0.34.0")
    env, notes = vllm_env(cmd, {})
    assert env == {PROFILE_ENV: "0"} and PROFILE_ENV in notes[0]
    # The user's own value wins and is named.
    env, notes = vllm_env(cmd, {PROFILE_ENV: "4096"})
    assert env == {} and "4096" in notes[0]
    # Adaptive verification off, or no draft: nothing.
    cfg.adaptive_verification = False
    assert vllm_env(vllm_launch(cfg, draft, "0.34.0")[0], {}) == ({}, [])
    assert vllm_env(vllm_launch(cfg, None, "0.34.0")[0], {}) == ({}, [])


@pytest.mark.skipif(not VLLM034_WHEEL.is_file(), reason="vLLM 0.34.0 wheel not cached")
def test_vllm034_reads_that_variable_for_its_profile():
    """The wheel's own source: the variable exists with the 8192-token default, and the runner's
    cost profile passes it as each dummy request's context."""
    with zipfile.ZipFile(VLLM034_WHEEL) as whl:
        envs = whl.read("vllm/envs.py").decode()
        manager = whl.read("vllm/v1/worker/gpu/spec_decode/adaptive_verification.py").decode()
    assert f'os.getenv("{PROFILE_ENV}", "8192")' in envs
    assert f'"context_len": envs.{PROFILE_ENV}' in manager
