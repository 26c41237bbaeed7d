"""Held-out figures over each answer's first N tokens: the mask against a naive loop, and a run
whose window covers every answer reporting exactly its whole-answer figures."""

import json

import pytest
import torch

from tests.integration.test_distill import fast
from train.distill import main
from train.loop.anchors import answer_head_mask


def naive_head(loss_mask, n, doc_ids):
    out = torch.zeros_like(loss_mask)
    for r in range(loss_mask.shape[0]):
        run = 0
        for t in range(loss_mask.shape[1]):
            same = t > 0 and (doc_ids is None or doc_ids[r, t] == doc_ids[r, t - 1])
            run = (run + 1 if same and loss_mask[r, t - 1] else 1) if loss_mask[r, t] else 0
            out[r, t] = int(loss_mask[r, t] and run <= n)
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_docs", [False, True])
def test_answer_head_mask_matches_a_loop(seed, with_docs):
    g = torch.Generator().manual_seed(seed)
    loss = (torch.rand(3, 40, generator=g) < 0.7).long()
    docs = torch.randint(0, 3, (3, 40), generator=g).sort(dim=1).values if with_docs else None
    for n in (1, 2, 5, 100):
        assert torch.equal(answer_head_mask(loss, n, docs), naive_head(loss, n, docs))


def _final_eval(out):
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["split"] == "eval"][-1]


def test_a_window_over_whole_answers_reports_the_whole_answer_figures(target, tmp_path):  # noqa: F811
    out = tmp_path / "wide"
    assert main(fast(target, out, "trainer.eval_answer_head=100000")) == 0
    ev = _final_eval(out)
    assert ev["answer_head_tokens"] == 100000
    for k in ("analytic_tau", "greedy_tau"):
        assert ev[f"answer_head_{k}"] == pytest.approx(ev[k], abs=1e-9)
    assert ev["answer_head_acceptance_per_pos"] == pytest.approx(ev["acceptance_per_pos"])

    out = tmp_path / "head"
    assert main(fast(target, out, "trainer.eval_answer_head=3")) == 0
    ev = _final_eval(out)
    assert ev["answer_head_tokens"] == 3 and 1.0 <= ev["answer_head_analytic_tau"] <= 8.0
    assert ev["answer_head_analytic_tau"] != pytest.approx(ev["analytic_tau"], abs=1e-9)

    out = tmp_path / "off"
    assert main(fast(target, out, "trainer.eval_answer_head=0")) == 0
    assert not any(k.startswith("answer_head") for k in _final_eval(out))
