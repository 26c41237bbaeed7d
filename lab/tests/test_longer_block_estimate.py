"""longer_block_estimate.py: rounds stopped at the cap go on at the last slot's rate."""

import json
import random

import pytest

from lab.analysis.longer_block_estimate import estimate, extra_after_cap, main, table
from serve.engine.stats import SpecDecodeStats


def row_from_rounds(draft, accepted_counts, cap, t=0.0, domain="sharegpt"):
    """An eval_acceptance.py row, the engine's report, from each round's accepted drafts."""
    stats = SpecDecodeStats(num_speculative_tokens=cap)
    for a in accepted_counts:
        stats.add(1, cap, a, [1] * a + [0] * (cap - a))
    return {"draft": draft, "temperature": t, "domain": domain, **stats.report()}


def test_extra_after_cap_is_the_mean_of_a_truncated_geometric():
    # Naively: P(exactly j more) = c^j (1 - c) below the limit, c^m at it.
    c, m = 0.8, 8
    naive = sum(j * c**j * (1 - c) for j in range(m)) + m * c**m
    assert extra_after_cap(c, m) == pytest.approx(naive)
    assert extra_after_cap(0.9, 0) == 0.0


def test_a_draft_that_follows_the_rate_is_estimated_near_its_longer_run():
    # Rounds accept each slot with probability c, up to 15; cut at 7 they read as a block-7
    # evaluation. The estimate from the cut rows should land near the uncut mean.
    rng, c = random.Random(0), 0.8
    rounds = []
    for _ in range(40_000):
        a = 0
        while a < 15 and rng.random() < c:
            a += 1
        rounds.append(a)
    cut = row_from_rounds("d", [min(a, 7) for a in rounds], cap=7)
    e = estimate(cut, 15)
    assert e["tau"] == pytest.approx(cut["mean_acceptance_length"])
    assert e["full_rounds"] == pytest.approx(c**7, abs=0.01)
    assert e["tau_longer"] == pytest.approx(1 + sum(rounds) / len(rounds), rel=0.01)
    assert e["tau_longer"] > e["tau"] + 0.3  # the cap cost something worth estimating


def test_at_the_evaluated_block_nothing_changes_and_a_shorter_one_is_refused():
    r = row_from_rounds("d", [0, 3, 7, 7, 2], cap=7)
    assert estimate(r, 7)["tau_longer"] == pytest.approx(r["mean_acceptance_length"])
    assert r["mean_acceptance_length"] == pytest.approx(1 + 19 / 5)  # the rows are the engine's
    # One draft a round: the last slot is the first, accepted in 3 rounds of 4.
    one = estimate(row_from_rounds("d", [1, 1, 0, 1], cap=1), 3)
    assert one["last_slot_conditional"] == pytest.approx(0.75)
    assert one["tau_longer"] == pytest.approx(1.75 + 0.75 * (0.75 + 0.75**2))
    with pytest.raises(SystemExit, match="shorter"):
        estimate(r, 5)


def test_the_table_and_cli(tmp_path, capsys):
    rows = [row_from_rounds("dspark", [7, 7, 2, 0], 7), row_from_rounds("dflash", [7, 1, 0, 0], 7)]
    lines = table(rows, "dspark", "dflash", 15)
    assert len(lines) == 4 and lines[2].split("|")[3].strip() == "dspark"
    now = float(lines[2].split("|")[8])
    taus = [r["mean_acceptance_length"] for r in rows]
    assert now == pytest.approx(taus[0] / taus[1], abs=5e-4)
    f = tmp_path / "eval.json"
    f.write_text(json.dumps(rows))
    assert main([str(f), "dspark", "dflash", "--block", "11"]) == 0
    assert "tau at block 11" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no temperature"):
        table(rows, "dspark", "eagle", 15)
