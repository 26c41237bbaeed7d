"""scripts/paired_interval.py: the paired bootstrap and the tau ratio of two drafts' evaluations."""

import json

import pytest

from scripts.paired_interval import (
    main,
    paired_interval,
    ratio_table,
    tau_of_prompts,
    tau_ratio_interval,
)


def rows(draft, per_prompt_by_domain, t=0.0):
    return [
        {"draft": draft, "temperature": t, "domain": d, "per_prompt": pp}
        for d, pp in per_prompt_by_domain.items()
    ]


def test_tau_of_prompts_pools_rounds_not_prompts():
    # 1 + (3 + 0) / (2 + 4): a long prompt weighs more than a short one.
    assert tau_of_prompts([[2, 3], [4, 0]]) == pytest.approx(1.5)
    assert tau_of_prompts([]) == 0.0


def test_the_same_draft_twice_has_a_point_interval_at_one():
    pp = {"sharegpt": [[10, 7], [8, 2], [5, 5]], "humaneval": [[3, 1], [9, 9]]}
    ci = tau_ratio_interval(rows("a", pp), rows("b", pp))
    assert ci["value"] == 1.0 and ci["low"] == 1.0 and ci["high"] == 1.0 and ci["pairs"] == 5


def test_the_ratio_pools_every_domain_and_pairs_prompt_by_prompt():
    a = {"sharegpt": [[10, 10], [10, 0]], "humaneval": [[4, 4]]}
    b = {"sharegpt": [[10, 5], [10, 0]], "humaneval": [[4, 2]]}
    ci = tau_ratio_interval(rows("dspark", a), rows("dflash", b))
    assert ci["value"] == pytest.approx((1 + 14 / 24) / (1 + 7 / 24))
    assert ci["low"] <= ci["value"] <= ci["high"] and ci["pairs"] == 3
    # A domain's rows of one draft only, or rows from before per-prompt counts: no interval.
    one_domain = rows("dflash", {"sharegpt": b["sharegpt"]})
    assert tau_ratio_interval(rows("dspark", a), one_domain) is None
    old = [{k: v for k, v in r.items() if k != "per_prompt"} for r in rows("dflash", b)]
    assert tau_ratio_interval(rows("dspark", a), old) is None
    with pytest.raises(ValueError):  # prompt lists that cannot pair
        tau_ratio_interval(rows("dspark", a), rows("dflash", {**b, "humaneval": []}))


def test_the_interval_narrows_with_more_pairs_and_is_reproducible():
    pairs = [(1.0 + (i % 7) / 10, 1.0 + (i % 5) / 10) for i in range(400)]

    def ratio(ps):
        return sum(a for a, _ in ps) / sum(b for _, b in ps)

    wide, narrow = paired_interval(pairs[:25], ratio), paired_interval(pairs, ratio)
    assert narrow["high"] - narrow["low"] < wide["high"] - wide["low"]
    assert paired_interval(pairs, ratio) == narrow
    assert paired_interval([], ratio) is None


def test_ratio_table_divides_by_the_named_base_per_domain_and_pooled(tmp_path, capsys):
    a = {"sharegpt": [[10, 10], [10, 0]], "humaneval": [[4, 4]]}
    b = {"sharegpt": [[10, 5], [10, 0]], "humaneval": [[4, 2]]}
    evals = rows("dflash", b) + rows("dspark", a)  # the base first, as eval_acceptance ran it
    for r in evals:
        r["mean_acceptance_length"] = tau_of_prompts(r["per_prompt"])
    lines = ratio_table(evals, "dspark", "dflash")
    by_domain = {line.split(" | ")[1]: line.split(" | ") for line in lines[2:]}
    assert set(by_domain) == {"humaneval", "sharegpt", "pooled"}
    # naive: DSpark's pooled tau over DFlash's, not the other way round
    assert float(by_domain["sharegpt"][4]) == pytest.approx((1 + 10 / 20) / (1 + 5 / 20), abs=5e-4)
    assert float(by_domain["humaneval"][4]) == pytest.approx(2.0 / 1.5, abs=5e-4)
    assert float(by_domain["pooled"][4]) == pytest.approx((1 + 14 / 24) / (1 + 7 / 24), abs=5e-4)
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(evals))
    assert main([str(path), "dflash", "dspark"]) == 0
    assert "| 0 | pooled | - | - | 0.816 | " in capsys.readouterr().out
    with pytest.raises(SystemExit, match="eagle"):
        ratio_table(evals, "dspark", "eagle")


def test_the_pooled_row_takes_only_the_domains_named(capsys, tmp_path):
    """A set of prompts the drafts trained on (sharegpt_read) is shown on its own row but left
    out of a pooled held-out figure when --pool names the held-out domains."""
    a = {"sharegpt": [[10, 10], [10, 0]], "humaneval": [[4, 4]], "sharegpt_read": [[5, 20]]}
    b = {"sharegpt": [[10, 5], [10, 0]], "humaneval": [[4, 2]], "sharegpt_read": [[20, 5]]}
    evals = rows("dflash", b) + rows("dspark", a)
    for r in evals:
        r["mean_acceptance_length"] = tau_of_prompts(r["per_prompt"])
    lines = ratio_table(evals, "dspark", "dflash", pool=["sharegpt", "humaneval"])
    by_domain = {line.split(" | ")[1]: line.split(" | ") for line in lines[2:]}
    assert set(by_domain) == {
        "humaneval",
        "sharegpt",
        "sharegpt_read",
        "pooled (humaneval, sharegpt)",
    }
    two = float(by_domain["pooled (humaneval, sharegpt)"][4])
    assert two == pytest.approx((1 + 14 / 24) / (1 + 7 / 24), abs=5e-4)
    every = ratio_table(evals, "dspark", "dflash")[2:]
    everything = {ln.split(" | ")[1]: ln.split(" | ") for ln in every}
    assert float(everything["pooled"][4]) == pytest.approx((1 + 34 / 29) / (1 + 12 / 44), abs=5e-4)
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(evals))
    assert main([str(path), "dspark", "dflash", "--pool", "sharegpt", "humaneval"]) == 0
    assert "| 0 | pooled (humaneval, sharegpt) | - | - | 1.226 | " in capsys.readouterr().out
