"""lab/analysis/smollm2_summary.py: headline figures beside the raw files they come from."""

import json

import pytest

from lab.analysis.smollm2_summary import summary


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


def test_the_ratio_pools_the_heldout_domains_only(tmp_path):
    """Rows on prompts the drafts read (sharegpt_read) do not enter dspark_over_dflash_*."""

    def row(draft, domain, drafts, accepted):
        tau = 1 + accepted / drafts
        return {
            "draft": draft,
            "temperature": 0.0,
            "domain": domain,
            "drafts": drafts,
            "per_position_rate": [accepted / drafts / 2] * 2,
            "mean_acceptance_length": tau,
            "per_prompt": [[drafts, accepted]],
        }

    ev = [
        row("dspark", "sharegpt", 10, 12),
        row("dspark", "humaneval", 10, 14),
        row("dspark", "sharegpt_read", 10, 60),
        row("dflash", "sharegpt", 10, 10),
        row("dflash", "humaneval", 10, 10),
        row("dflash", "sharegpt_read", 10, 10),
    ]
    (tmp_path / "smollm2_dspark_vs_dflash.json").write_text(json.dumps(ev))
    out = summary(tmp_path, None)
    assert out["dspark_over_dflash_t0"] == pytest.approx((1 + 26 / 20) / (1 + 20 / 20))
    assert out["tau_t0_sharegpt"] == pytest.approx(2.2)


def test_written_summary_is_in_the_results_format(tmp_path):
    """main writes what scripts/results_tables.py reads: each source relative to the summary's
    own folder (found from there), the device and kind at the top."""
    from lab.analysis.smollm2_summary import main
    from scripts.results_tables import read_rows

    res = tmp_path / "run"
    res.mkdir()
    rows = [
        {
            "concurrency": 1,
            "variant": "dspark",
            "decode_speedup": 1.5,
            "mean_acceptance_length": 2.4,
        }
    ]
    (res / "vllm_speedup.json").write_text(json.dumps(rows))
    out = tmp_path / "results" / "smollm2" / "summary.json"
    out.parent.mkdir(parents=True)
    assert main([str(res), "--device", "NVIDIA H100", "--out", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["device"] == "NVIDIA H100" and s["kind"] == "measured"
    assert s["vllm_speedup_b1_source"] == "../../run/vllm_speedup.json"
    assert (out.parent / s["vllm_speedup_b1_source"]).resolve() == (res / "vllm_speedup.json")
    # The figures whose files were missing are null: results_tables refuses them until removed.
    kept = {k: v for k, v in s.items() if v is not None and not k.endswith("_source")}
    kept |= {f"{k}_source": s[f"{k}_source"] for k in kept if f"{k}_source" in s}
    out.write_text(json.dumps(kept))
    got = read_rows(out, tmp_path / "results")
    assert sorted((r.key, r.value, r.kind, r.device) for r in got) == [
        ("vllm_speedup_b1", 1.5, "measured", "NVIDIA H100"),
        ("vllm_tau_t0_sharegpt_b1", 2.4, "measured", "NVIDIA H100"),
    ]
