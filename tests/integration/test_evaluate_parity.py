"""serve.evaluate and serve.parity on a tiny trained target with a draft that knows its answers
(tests/integration/bigram_draft.py): the report's figures against independent arithmetic, and the
parity check's positive and negative controls (the negative: the engine's copy of the draft with
its d2t map permuted, as a server that misreads the map would hold it)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import serve.engine.loader as engine_loader
from common.acceptance import chain_tau, tau_of_prompts, two_proportion_test
from common.sampling.draft_probs import DraftProbs
from serve import evaluate, parity
from serve.engine.sampler import Walk
from tests.integration.bigram_draft import write_bigram_draft
from tests.tiny import word_chat_rows, write_trained_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    target = write_trained_target(root / "target", steps=100)
    draft = write_bigram_draft(target, root / "draft")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in word_chat_rows(24, seed=1)))
    return target, draft, prompts


def test_chain_tau_and_pooled_tau_match_naive_loops():
    alpha = [0.9, 0.5, 0.25]
    expect, run = 1.0, 1.0
    for a in alpha:
        run *= a
        expect += run
    assert chain_tau(alpha) == pytest.approx(expect, abs=1e-12)
    assert tau_of_prompts([[2, 3], [4, 1]]) == pytest.approx((3 + 1 + 4 + 2) / 6)


def test_two_proportion_test_matches_the_textbook_formula():
    r = two_proportion_test(30, 100, 50, 100, alpha=0.05)
    pooled = 80 / 200
    z = (0.3 - 0.5) / math.sqrt(pooled * (1 - pooled) * (2 / 100))
    assert r["z"] == pytest.approx(z)
    assert r["rejects"]  # |z| = 2.89 > 1.96
    assert r["mdd"] == pytest.approx((1.959964 + 0.841621) * math.sqrt(0.25 * 2 / 100), rel=1e-5)
    assert two_proportion_test(0, 0, 1, 2, alpha=0.05)["mdd"] is None


class _Passthrough:
    def verify(self, *args):
        return "verdict"


def test_analytic_probe_is_sum_of_min_over_the_vocabulary():
    g = torch.Generator().manual_seed(0)
    r, n, v = 3, 2, 7
    logits = torch.randn(r, n + 1, v, generator=g)
    q = torch.softmax(torch.randn(r, n, v, generator=g), -1)
    ids = q.argmax(-1)
    walk = Walk(ids, DraftProbs.from_target(q, ids), None)
    probe = evaluate.AnalyticProbe(_Passthrough())
    temp = torch.tensor([1.0, 0.5, 1.0])
    verify_len = torch.tensor([2, 2, 1])
    assert probe.verify(logits, walk, temp, None, None, verify_len) == "verdict"
    sums = [0.0, 0.0]
    counts = [0, 0]
    for i in range(r):
        for k in range(int(verify_len[i])):
            p = torch.softmax(logits[i, k].double() / temp[i].double(), -1)
            sums[k] += sum(min(float(a), float(b)) for a, b in zip(p, q[i, k].double()))
            counts[k] += 1
    assert probe.counts == counts
    assert probe.per_pos() == pytest.approx([s / c for s, c in zip(sums, counts)], abs=1e-6)


def test_evaluate_writes_the_report_it_prints(pair, tmp_path, capsys):
    target, draft, prompts = pair
    out = tmp_path / "ev"
    argv = ["--target", str(target), "--draft", f"a={draft}", "--draft", f"b={draft}"]
    argv += ["--prompts", f"words={prompts}", "--out", str(out), "--max-new-tokens", "12"]
    argv += ["--max-prompts", "8", "--temperatures", "0", "1"]
    assert evaluate.main(argv) == 0
    rep = json.loads((out / "eval.json").read_text())
    assert [(r["draft"], r["temperature"]) for r in rep["rows"]] == [
        ("a", 0.0), ("b", 0.0), ("a", 1.0), ("b", 1.0)
    ]  # fmt: skip
    for r in rep["rows"]:
        rounds = sum(n for n, _ in r["per_prompt"])
        assert r["prompts"] == 8 and r["drafts"] == rounds
        assert r["mean_acceptance_length"] == pytest.approx(
            sum(a + n for n, a in r["per_prompt"]) / rounds
        )
        low, high = r["tau_interval_95"]
        assert low <= r["mean_acceptance_length"] <= high
        assert r["analytic_tau"] == pytest.approx(chain_tau(r["analytic_acceptance_per_pos"]))
        assert r["mean_acceptance_length"] > 2.0  # the draft knows the answers
    # T=0: the same draft twice answers identically, so the paired ratio is exactly 1.
    b0 = rep["rows"][1]
    assert b0["vs_first"]["value"] == 1.0 and b0["vs_first"]["low"] == 1.0
    shown = capsys.readouterr().out
    assert "| a | 0 | words | 8 |" in shown and "analytic tau" in shown


def test_evaluate_bad_input_is_exit_2(pair, tmp_path, capsys):
    target, draft, _ = pair
    argv = ["--target", str(target), "--draft", f"a={draft}", "--out", str(tmp_path)]
    assert evaluate.main(argv + ["--prompts", "words=/no/such.jsonl"]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no prompt here"}) + "\n")
    assert evaluate.main(argv + ["--prompts", f"words={bad}"]) == 2
    assert "a row needs `messages`" in capsys.readouterr().err


def _parity(pair, tmp_path, new_tokens: int):
    target, draft, prompts = pair
    report = tmp_path / "parity.json"
    argv = [str(draft), "--target", str(target), "--prompts", str(prompts)]
    argv += ["--max-prompts", "24", "--max-new-tokens", str(new_tokens), "--json", str(report)]
    return parity.main(argv), json.loads(report.read_text())


def test_parity_passes_for_the_draft_as_exported(pair, tmp_path, capsys):
    rc, rep = _parity(pair, tmp_path, new_tokens=20)
    assert rc == 0, capsys.readouterr().out
    assert rep["reference"] == "teacher-forced"
    # The test has power where it matters: position 0's MDD within the fixed bound.
    assert all(t["mdd"] <= parity.MAX_MDD for t in rep["tests"] if t["pos"] == 0)
    # At T=0 acceptance is deterministic: the served counts equal the teacher-forced ones.
    c0 = rep["counts"]["0.0"]
    assert c0["engine"] == [round(x) for x in c0["reference"]]
    assert "minimum detectable difference at position 0" in capsys.readouterr().out


def test_parity_fails_when_the_server_misreads_the_d2t_map(pair, tmp_path, monkeypatch):
    load = engine_loader.load_checkpoint

    def permuted_d2t(*args, **kwargs):
        model = load(*args, **kwargs)
        ids = torch.arange(model.config.draft_vocab) + model.d2t  # target id of each draft id
        perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))
        model.d2t.copy_(ids[perm] - torch.arange(len(ids)))
        return model

    monkeypatch.setattr(engine_loader, "load_checkpoint", permuted_d2t)
    rc, rep = _parity(pair, tmp_path, new_tokens=12)  # ~1 token a round: rounds come fast
    assert rc == 1
    assert any(t["rejects"] for t in rep["tests"] if t["pos"] == 0)


def test_parity_bad_input_is_exit_2(pair, capsys):
    target, draft, _ = pair
    assert parity.main([str(draft), "--target", str(target), "--prompts", "/no/such"]) == 2
    assert "is not an existing file" in capsys.readouterr().err
