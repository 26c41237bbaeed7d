"""common.spec_config: the one `--speculative-config` builder, what each vLLM version lacks, and
that the launcher, the model card and serve.check produce the same dict for one checkpoint."""

from __future__ import annotations

import json
import shlex

import pytest

from common.checkpoint import read_config, save_checkpoint
from common.spec_config import (
    VLLM_FEATURES,
    fit_to_vllm,
    missing_features,
    parse_vllm_version,
    speculative_config,
    vllm_supported,
)
from serve import launch
from serve.check import main as serve_check
from tests.conftest import tiny_config, tiny_model
from train.publish.model_card import write_model_card


def spec_after(flag: str, line: str) -> dict:
    argv = shlex.split(line)
    return json.loads(argv[argv.index(flag) + 1])


def test_builder_keys():
    anchor = tiny_config()  # confidence head, anchor-first, B=4
    assert speculative_config(anchor, "/d") == {
        "method": "dspark",
        "model": "/d",
        "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic",
    }
    on = speculative_config(anchor, "/d", adaptive_verification=True, num_speculative_tokens=2)
    assert on["enable_adaptive_verification"] is True and on["num_speculative_tokens"] == 2
    onen = tiny_config(sample_from_anchor=False, enable_confidence_head=False)
    off = speculative_config(onen, "/d", adaptive_verification=True, draft_sample_method="greedy")
    assert off["num_speculative_tokens"] == 3 and "enable_adaptive_verification" not in off
    assert off["draft_sample_method"] == "greedy"
    with pytest.raises(ValueError, match="draft_sample_method"):
        speculative_config(anchor, "/d", draft_sample_method="topk")


def test_versions_and_features():
    assert parse_vllm_version("0.34.0+cpu") == (0, 34) and parse_vllm_version("dev") is None
    assert [vllm_supported(v) for v in ("0.25.9", "0.26.0", "0.34.2rc1", "0.35.0", None)] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert {f.name for f in missing_features("0.26.0")} == {f.name for f in VLLM_FEATURES}
    assert [f.name for f in missing_features("0.27.0")] == [
        "adaptive_verification",
        "batch_sharded_sampling",
        "batch_sharded_with_adaptive",
        "sharded_sequential_sampling",
        "per_request_spec_decode_metrics",
    ]
    assert [f.name for f in missing_features("0.33.1")] == [
        "batch_sharded_with_adaptive",
        "sharded_sequential_sampling",
    ]
    assert missing_features("0.34.0") == [] and missing_features(None) == []
    spec = speculative_config(tiny_config(), "/d", adaptive_verification=True)
    old, notes = fit_to_vllm(spec, "0.26.0")
    assert old == {k: v for k, v in spec.items() if k != "enable_adaptive_verification"}
    assert len(notes) == 1 and "vLLM 0.26.0" in notes[0] and "dropped" in notes[0]
    assert fit_to_vllm(spec, "0.34.0") == (spec, [])


def test_launcher_card_and_check_agree(tmp_path, monkeypatch, capsys):
    """Negative control built in: the card used to emit enable_adaptive_verification and no
    draft_sample_method, which this equality catches."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    ckpt = save_checkpoint(tiny_model(), tmp_path / "draft").resolve()
    expected = speculative_config(read_config(ckpt), str(ckpt))

    monkeypatch.setattr(launch, "probe_vllm_version", lambda: "0.34.0")
    monkeypatch.setattr(launch, "probe_cuda_devices", lambda: 1)
    assert launch.main([f"target={target}", f"checkpoint={ckpt}", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    (cmd,) = [ln.split("command: ", 1)[1] for ln in out.splitlines() if "command: " in ln]
    from_launcher = spec_after("--speculative-config", cmd)

    card = write_model_card(
        ckpt, target=str(target), recipe={}, metrics={}, per_position_acceptance=[]
    ).read_text()
    (line,) = [ln for ln in card.splitlines() if ln.startswith("vllm serve ")]
    from_card = spec_after("--speculative-config", line)

    assert serve_check([str(ckpt)]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("vLLM: ")]
    from_check = spec_after("--speculative-config", line)

    assert from_launcher == from_card == from_check == expected
