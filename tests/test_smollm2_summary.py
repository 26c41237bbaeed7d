"""scripts/smollm2_summary.py: headline figures beside the raw files they come from."""

import json

from scripts.smollm2_summary import summary


def test_speedups_carry_their_paired_interval_and_missing_files_are_null(tmp_path):
    rows = [
        {
            "concurrency": 1,
            "variant": "dspark",
            "decode_speedup": 1.5,
            "mean_acceptance_length": 2.4,
            "decode_speedup_paired_ci95": {"value": 1.5, "low": 1.4, "high": 1.6, "pairs": 32},
        },
        {"concurrency": 8, "variant": "dspark", "decode_speedup": 1.2},
        {"concurrency": 8, "variant": "dspark_k3", "decode_speedup": 9.9},
    ]
    (tmp_path / "vllm_speedup.json").write_text(json.dumps(rows))
    out = summary(tmp_path, None)
    src = str(tmp_path / "vllm_speedup.json")
    assert out["vllm_speedup_b1"] == 1.5 and out["vllm_speedup_b1_ci95"] == [1.4, 1.6]
    assert out["vllm_speedup_b1_ci95_source"] == src
    # A row from before the per-request figures has no interval key; other variants are not it.
    assert out["vllm_speedup_b8"] == 1.2 and "vllm_speedup_b8_ci95" not in out
    assert out["vllm_speedup_b32"] is None and out["vllm_speedup_b32_source"] == src
    assert out["tau_t0_sharegpt"] is None and out["analytic_tau_sharegpt"] is None
