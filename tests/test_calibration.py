"""STS calibration: the temperature fit, ECE, the CLI on a trained checkpoint, and the engine's
scheduler consuming calibrated confidences."""

import json

import pytest
import torch

from common.sampling.calibration import (
    CALIBRATION_NAME,
    apply_temperatures,
    expected_calibration_error,
    fit_temperature,
    load_temperatures,
)


def test_fit_recovers_the_generating_temperature_and_lowers_ece():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(20000, generator=g) * 3
    target = torch.bernoulli(torch.sigmoid(z / 2.5), generator=g)
    t = fit_temperature(z, target)
    assert t == pytest.approx(2.5, rel=0.05)
    before = expected_calibration_error(torch.sigmoid(z), target)
    after = expected_calibration_error(torch.sigmoid(z / t), target)
    assert after < 0.02 < before


def test_ece_matches_a_naive_binning():
    c = torch.tensor([0.05, 0.1, 0.55, 0.6, 0.95])
    y = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0])
    # bins of width 1/15: {0.05}, {0.1}, {0.55}, {0.6}, {0.95} are all separate bins
    ref = sum(abs(ci - yi) for ci, yi in zip(c.tolist(), y.tolist(), strict=True)) / 5
    assert expected_calibration_error(c, y) == pytest.approx(ref)


def test_apply_and_load(tmp_path):
    c = torch.tensor([[0.2, 0.7, 0.9]])
    assert torch.allclose(apply_temperatures(c, torch.ones(3)), c, atol=1e-6)
    hot = apply_temperatures(c, torch.full((3,), 4.0))
    assert ((hot - 0.5).abs() < (c - 0.5).abs()).all()  # T > 1 pulls toward 0.5
    assert load_temperatures(tmp_path) is None
    (tmp_path / CALIBRATION_NAME).write_text(json.dumps({"temperatures": [1.0, -2.0]}))
    with pytest.raises(ValueError, match="positive"):
        load_temperatures(tmp_path)


def test_calibrate_cli_on_a_trained_checkpoint(tmp_path):
    from tests.test_distill import fast
    from tests.tiny_assets import build_tiny_random_target
    from train.calibrate import main as calibrate
    from train.distill import main as distill

    target = build_tiny_random_target(tmp_path / "t")
    assert distill(fast(target, tmp_path / "run")) == 0
    ckpt = tmp_path / "run" / "final"
    assert (
        calibrate(
            [
                str(ckpt),
                "--target",
                str(target),
                "--seq-len",
                "64",
                "--device",
                "cpu",
                "--anchors",
                "8",
            ]
        )
        == 0
    )
    res = json.loads((ckpt / CALIBRATION_NAME).read_text())
    assert len(res["temperatures"]) == 7 and all(t > 0 for t in res["temperatures"])
    assert len(res["ece_before"]) == len(res["ece_after"]) == 7
    assert torch.equal(load_temperatures(ckpt), torch.tensor(res["temperatures"]))


def test_engine_scheduler_sees_calibrated_confidences(tmp_path, monkeypatch):
    import serve.engine.engine as eng_mod
    from serve.engine import Engine, EngineOptions, SamplingParams
    from tests.test_engine import PROMPTS, make_draft, make_target, save_draft, save_target

    target = make_target(0, predictable=True)
    draft = make_draft(target, True, None, tuned=True)
    save_target(target, tmp_path / "target")
    save_draft(draft, tmp_path / "draft")
    seen = []
    real = eng_mod.plan_budgeted_verify_lengths
    monkeypatch.setattr(
        eng_mod,
        "plan_budgeted_verify_lengths",
        lambda conf, table: seen.append(conf.clone()) or real(conf, table),
    )

    def run():
        e = Engine.from_options(
            EngineOptions(
                target=str(tmp_path / "target"),
                checkpoint=str(tmp_path / "draft"),
                dtype="float64",
                adaptive_verification=True,
                max_model_len=64,
            )
        )
        return e.generate([PROMPTS[0]], SamplingParams(max_tokens=8))

    plain = run()
    raw = seen[0]
    seen.clear()
    n = raw.shape[1]
    (tmp_path / "draft" / CALIBRATION_NAME).write_text(json.dumps({"temperatures": [3.0] * n}))
    assert run() == plain  # greedy output unchanged (lossless either way)
    assert torch.allclose(seen[0], apply_temperatures(raw, torch.full((n,), 3.0)), atol=1e-6)
