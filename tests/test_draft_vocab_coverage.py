"""scripts/draft_vocab_coverage.py against a per-token loop: the bound on acceptance that a reduced
draft vocabulary sets (token share at T=0, probability mass at T=1)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from scripts.draft_vocab_coverage import answers, coverage
from tests.tiny_assets import build_tiny_random_target


def test_coverage_matches_a_token_by_token_loop(tmp_path):
    target = str(build_tiny_random_target(tmp_path / "t"))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    outs = answers(model, prompts, max_tokens=6, pad=0, batch=2)
    for p, o in zip(prompts, outs, strict=True):  # greedy: each answer token is the argmax
        with torch.no_grad():
            assert int(model(torch.tensor([p])).logits[0, -1].argmax()) == o[0]
    vocab = model.config.vocab_size
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[: vocab // 3]] = True
    t2d[outs[0][0]] = True  # at least one answer token inside, one stop id cuts a row short
    stop = outs[1][3]
    got = coverage(model, prompts, outs, t2d, {stop})

    inside = total = 0
    mass = 0.0
    for p, o in zip(prompts, outs, strict=True):
        o = o[: o.index(stop)] if stop in o else o
        for k, tok in enumerate(o):
            with torch.no_grad():
                probs = torch.softmax(model(torch.tensor([p + o[:k]])).logits[0, -1].double(), -1)
            mass += float(probs[t2d].sum())
            inside += bool(t2d[tok])
            total += 1
    assert got["tokens"] == total and 0 < total < 18
    assert got["t0_token_share"] == inside / total
    assert abs(got["t1_mass"] - mass / total) < 1e-5
    assert 0 < got["t0_token_share"] < 1
