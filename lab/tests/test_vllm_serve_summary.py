"""vllm_serve_summary.py: each headline figure read from its raw file, null when absent."""

import json

from lab.analysis.vllm_serve_summary import summary


def test_figures_come_from_their_files(tmp_path):
    rows = [
        {"concurrency": c, "variant": v, "decode_speedup": s, "mean_acceptance_length": t}
        for c, v, s, t in [
            (1, "dspark", 1.5, 2.5),
            (8, "dspark", 1.2, 2.4),
            (1, "dspark_adaptive", 1.7, 2.2),
        ]
    ]
    (tmp_path / "vllm_speedup.json").write_text(json.dumps(rows))
    checks = {"a": True, "b": False}
    (tmp_path / "vllm034_gate.json").write_text(
        json.dumps({"vllm_version": "0.34.0", "checks": checks})
    )
    (tmp_path / "vllm034_tests.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/>'
        '<testsuite tests="3" failures="0" errors="1" skipped="0"/></testsuites>'
    )
    s = summary(tmp_path, "vllm034_")
    assert s["vllm_version"] == "0.34.0"
    assert (s["speedup_b1"], s["speedup_b8"], s["speedup_b32"]) == (1.5, 1.2, None)
    assert (s["accept_len_b1"], s["accept_len_b1_adaptive"]) == (2.5, 2.2)
    assert s["speedup_b1_adaptive"] == 1.7 and s["speedup_b8_adaptive"] is None
    assert s["gate_passed"] is False and s["gate_failed_checks"] == ["b"]
    assert s["gate_passed_adaptive"] is None  # no adaptive gate file: null, not left out
    assert s["vllm_tests"] == {"tests": 8, "failures": 1, "errors": 1, "skipped": 2}
    assert s["speedup_b1_source"] == str(tmp_path / "vllm_speedup.json")


def test_a_file_the_run_lacks_comes_from_an_earlier_run(tmp_path):
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir(), old.mkdir()
    (new / "vllm034_gate_adaptive.json").write_text(json.dumps({"checks": {"x": True}}))
    (old / "vllm034_gate_adaptive.json").write_text(json.dumps({"checks": {"x": False}}))
    (old / "vllm034_gate.json").write_text(json.dumps({"vllm_version": "0.34.0", "checks": {}}))
    s = summary(new, "vllm034_", (old,))
    assert s["gate_passed_adaptive"] is True  # the run's own file wins
    assert s["gate_passed_adaptive_source"] == str(new / "vllm034_gate_adaptive.json")
    assert (s["vllm_version"], s["vllm_version_source"]) == (
        "0.34.0",
        str(old / "vllm034_gate.json"),
    )
    assert s["speedup_b1"] is None and s["speedup_b1_source"] == str(new / "vllm_speedup.json")
