"""served_vs_engine_table.py: vLLM's serve.bench counters beside the engine's on one set
of prompts."""

import json

import pytest

from lab.analysis.served_vs_engine_table import main, served_counts


def bench(accepted, drafts):
    return {
        "config": {"num_prompts": 4},
        "requests": [{}] * 4,
        "spec_decode": {
            "num_drafts": drafts,
            "num_draft_tokens": drafts * len(accepted),
            "num_accepted_tokens": sum(accepted),
            "accepted_per_pos": accepted,
            "mean_acceptance_length": 1 + sum(accepted) / drafts,
        },
    }


def engine(accepted, drafts, draft="d", domain="sharegpt", temperature=0.0):
    return {
        "draft": draft,
        "domain": domain,
        "temperature": temperature,
        "prompts": 4,
        "accepted_per_pos": accepted,
        "reached_per_pos": [drafts, *accepted[:-1]],
        "mean_acceptance_length": 1 + sum(accepted) / drafts,
    }


def test_served_counts_reach_each_position_as_the_engine_counts_it():
    c = served_counts(bench([60, 30, 10], 100))
    assert c["reached_per_pos"] == [100, 60, 30] == engine([60, 30, 10], 100)["reached_per_pos"]
    assert c["mean_acceptance_length"] == pytest.approx(2.0)
    with pytest.raises(SystemExit, match="no spec-decode counters"):
        served_counts({"config": {"num_prompts": 4}, "spec_decode": None})


def write(tmp_path, b, rows):
    (tmp_path / "b.json").write_text(json.dumps(b))
    (tmp_path / "e.json").write_text(json.dumps(rows))
    return ["--served", str(tmp_path / "b.json"), "--engine", str(tmp_path / "e.json")]


def test_equal_stacks_agree_and_a_far_one_differs(tmp_path, capsys):
    out = tmp_path / "out.json"
    args = write(tmp_path, bench([600, 300, 100], 1000), [engine([600, 300, 100], 1000)])
    assert main([*args, "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["tau_rel_diff"] == 0 and not any(p["rejects"] for p in r["positions"])
    # The engine accepting 0.9 at slot 0 against vLLM's 0.6 over 1,000 drafts: far past the MDD.
    args = write(tmp_path, bench([600, 300, 100], 1000), [engine([900, 300, 100], 1000)])
    assert main([*args, "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["positions"][0]["rejects"] and r["positions"][0]["mdd"] < 0.3
    assert r["tau_rel_diff"] == pytest.approx(0.3 / 2.3)
    assert "| 0 | 0.600 | 0.900 |" in capsys.readouterr().out


def test_the_engine_row_is_picked_by_draft_domain_and_temperature(tmp_path):
    rows = [engine([1, 0, 0], 10, draft="a"), engine([9, 0, 0], 10, draft="b", temperature=1.0)]
    args = write(tmp_path, bench([1, 0, 0], 10), rows)
    out = tmp_path / "o.json"
    assert main([*args, "--draft", "a", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["tau_rel_diff"] == 0
    with pytest.raises(SystemExit, match="no row for"):
        main([*args, "--draft", "b"])
