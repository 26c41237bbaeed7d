"""What `serve.launch` assumes about vLLM, checked against the installed vLLM's own code.

The launcher keeps no copy of vLLM's parsing: it owns its argv, the speculative config
(`common.spec_config`), a table of which vLLM release has which seed feature, and a few
refusals. Each assumption left is an oracle test here:
- the feature table says of the installed vLLM what its own config classes and DSpark speculator
  source say;
- our batch-sharded refusals are exactly those of vLLM's `_validate_batch_sharded_sampling`,
  executed on every combination of the inputs we decide on;
- the vLLM default our decision falls back to (`max_logprobs`) is vLLM's;
- the speculative config the launcher builds is accepted by vLLM's `create_engine_config`.
"""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from common.spec_config import VLLM_FEATURES, has_feature
from serve import launch
from serve.launch_config import LaunchRefused
from serve.vllm_args import VLLM_DEFAULT_MAX_LOGPROBS, decide_batch_sharded_sampling
from tests.tiny import write_draft
from tests.vllm import harness as H

pytestmark = pytest.mark.vllm


def installed_version() -> str:
    import vllm

    return vllm.__version__


def vllm_refuses_batch_sharded(tp, max_num_seqs, max_logprobs, adaptive) -> bool:
    """vLLM's own validation of --enable-batch-sharded-sampling, on a config holding only what
    it reads."""
    from vllm.config import VllmConfig

    fake = SimpleNamespace(
        parallel_config=SimpleNamespace(
            enable_batch_sharded_sampling=True, tensor_parallel_size=tp
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        model_config=SimpleNamespace(max_logprobs=max_logprobs, return_sampling_mask=False),
        speculative_config=SimpleNamespace(enable_adaptive_verification=adaptive),
    )
    try:
        VllmConfig._validate_batch_sharded_sampling(fake)
    except ValueError:
        return True
    return False


def test_probe_reads_the_installed_version():
    assert launch.probe_vllm_version() == installed_version()


def test_feature_table_matches_installed_vllm():
    import vllm
    from vllm.config import ObservabilityConfig, ParallelConfig, SpeculativeConfig

    root = Path(vllm.__file__).parent
    speculator = (root / "v1/worker/gpu/spec_decode/dspark/speculator.py").read_text()
    has_flag = "enable_batch_sharded_sampling" in ParallelConfig.__dataclass_fields__
    observed = {
        "adaptive_verification": "enable_adaptive_verification"
        in SpeculativeConfig.__dataclass_fields__,
        "batch_sharded_sampling": has_flag,
        "batch_sharded_with_adaptive": has_flag and not vllm_refuses_batch_sharded(2, 8, 0, True),
        "sharded_sequential_sampling": "_try_enable_sharded_sequential_sampling" in speculator,
        "sample_from_anchor": '"sample_from_anchor"' in speculator,
        "per_request_spec_decode_metrics": "per_request_spec_decode_metrics"
        in ObservabilityConfig.__dataclass_fields__,
    }
    version = installed_version()
    assert {f.name: has_feature(version, f.name) for f in VLLM_FEATURES} == observed


def test_capture_size_key_is_vllms():
    """serve.vllm_args raises compilation_config.max_cudagraph_capture_size above vLLM's default
    ceiling: the key must exist in the installed vLLM."""
    from vllm.config import CompilationConfig

    assert "max_cudagraph_capture_size" in CompilationConfig.__dataclass_fields__
    assert CompilationConfig(max_cudagraph_capture_size=1024).max_cudagraph_capture_size == 1024


def test_batch_sharded_refusals_are_vllms():
    version = installed_version()
    if not has_feature(version, "batch_sharded_sampling"):
        pytest.skip(f"vLLM {version} has no --enable-batch-sharded-sampling")
    checked = 0
    for tp, seqs, logprobs, adaptive in itertools.product(
        (1, 2, 4), (1, 2, 8), (-1, 0, VLLM_DEFAULT_MAX_LOGPROBS), (False, True)
    ):
        try:
            decide_batch_sharded_sampling(True, tp, seqs, logprobs, version, adaptive)
            ours = False
        except LaunchRefused:
            ours = True
        assert ours == vllm_refuses_batch_sharded(tp, seqs, logprobs, adaptive), (
            tp,
            seqs,
            logprobs,
            adaptive,
        )
        checked += 1
    assert checked == 54


def test_default_max_logprobs_is_vllms():
    from vllm.engine.arg_utils import EngineArgs

    default = EngineArgs.__dataclass_fields__["max_logprobs"].default
    assert getattr(default, "default", default) == VLLM_DEFAULT_MAX_LOGPROBS


@pytest.fixture(scope="module")
def launch_draft(random_target, vllm_workdir):
    path, model = write_draft(random_target, vllm_workdir / "launch_oracle")
    return path, model.config


def launcher_spec(monkeypatch, capsys, target, ckpt, *overrides) -> dict:
    monkeypatch.setattr(launch, "probe_vllm_version", installed_version)
    monkeypatch.setattr(launch, "probe_cuda_devices", lambda: 1)
    args = [f"target={target}", f"checkpoint={ckpt}", "engine=vllm", "dry_run=true", *overrides]
    assert launch.main(args) == 0
    out = capsys.readouterr().out
    (cmd,) = [ln.split("command: ", 1)[1] for ln in out.splitlines() if "command: " in ln]
    argv = shlex.split(cmd)
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_vllm_accepts_the_launchers_speculative_config(
    random_target, launch_draft, monkeypatch, capsys
):
    path, cfg = launch_draft
    spec = launcher_spec(monkeypatch, capsys, random_target, path)
    vc = H.engine_config(random_target, spec)
    assert vc.speculative_config.num_speculative_tokens == cfg.num_speculative_tokens
    assert vc.speculative_config.draft_sample_method == "probabilistic"
    # With adaptive verification the key reaches vLLM's own checks (which refuse it here only
    # because this CPU run is eager), not a schema error for an unknown key.
    spec = launcher_spec(monkeypatch, capsys, random_target, path, "adaptive_verification=true")
    assert ("enable_adaptive_verification" in spec) == has_feature(
        installed_version(), "adaptive_verification"
    )
    if "enable_adaptive_verification" in spec:
        with pytest.raises(ValueError, match="Adaptive verification requires full CUDA graphs"):
            H.engine_config(random_target, spec)
