"""scripts/draft_vocab_coverage.py against a per-token loop: the bound on acceptance that a reduced
draft vocabulary sets (token share at T=0, probability mass at T=1)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from scripts.draft_vocab_coverage import coverage
from scripts.target_greedy import greedy_answers
from tests.tiny_assets import build_tiny_random_target


def test_coverage_matches_a_token_by_token_loop(tmp_path):
    target = str(build_tiny_random_target(tmp_path / "t"))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    outs = greedy_answers(model, prompts, max_tokens=6, batch=2)
    for p, o in zip(prompts, outs, strict=True):  # greedy: each answer token is the argmax
        with torch.no_grad():
            assert int(model(torch.tensor([p])).logits[0, -1].argmax()) == o[0]
    vocab = model.config.vocab_size
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[: vocab // 3]] = True
    t2d[outs[0][0]] = True  # at least one answer token inside, one stop id cuts a row short
    stop = outs[1][3]
    got = coverage(model, prompts, outs, {"a": t2d, "all": torch.ones_like(t2d)}, {stop})
    assert got["all"]["t0_token_share"] == 1 and abs(got["all"]["t1_mass"] - 1) < 1e-9
    got = got["a"]

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


def test_vocabularies_from_counts_rank_assistant_tokens_only(tmp_path):
    import json
    from collections import Counter

    from transformers import AutoTokenizer

    from scripts.draft_vocab_coverage import vocab_masks_from_counts

    target = build_tiny_random_target(tmp_path / "t")
    tok = AutoTokenizer.from_pretrained(target)
    words = tok.convert_ids_to_tokens([20, 21, 22])
    rows = [  # the user turns' word is the most frequent overall, but only answers count
        {"messages": [{"role": "user", "content": " ".join([words[0]] * 9)},
                      {"role": "assistant", "content": f"{words[1]} {words[1]} {words[2]}"}]},
        {"messages": [{"role": "user", "content": words[0]},
                      {"role": "assistant", "content": ""}]},
    ]  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answer = Counter(tok(rows[0]["messages"][1]["content"], add_special_tokens=False)["input_ids"])
    ranked = sorted(answer, key=lambda t: (-answer[t], t))  # most frequent first, then lowest id
    assert tok.convert_tokens_to_ids(words[0]) not in answer
    masks = vocab_masks_from_counts(str(path), tok, len(tok), [1, 2, len(answer)])
    for n in (1, 2, len(answer)):
        assert masks[f"counts_{n}"].nonzero().flatten().tolist() == sorted(ranked[:n])
