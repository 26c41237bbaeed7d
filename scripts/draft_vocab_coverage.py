"""How much of the target's own output a reduced draft vocabulary can express: an upper bound on
acceptance that no amount of training lifts.

    python scripts/draft_vocab_coverage.py --target artifacts/smollm2-135m-instruct \
        --draft outputs/smollm2_dspark/final --num-prompts 32 --max-tokens 128 \
        --prompts sharegpt=artifacts/smollm2-data/sharegpt-heldout.jsonl \
        humaneval=artifacts/smollm2-data/humaneval-heldout.jsonl

Per domain, on held-out prompts (chat template, as scripts/eval_acceptance.py renders them), the
target answers greedily (HF `generate`, batched, left-padded, float32). Then:
- T=0: the share of the answer's tokens inside the draft vocabulary (`t2d`): a draft can only
  propose those, so it bounds the per-position acceptance at T=0;
- T=1: the target's mean probability mass inside the draft vocabulary at those positions, which
  bounds the per-position acceptance (1 - TV) of any draft over that vocabulary.
Outputs are cut at the first stop id. Prints a table; --json writes the numbers.

`--counts-from FILE --vocab-sizes N...` also scores the vocabularies `common.vocab.build_vocab_map`
would pick from FILE's assistant turns (chat rows, e.g. ShareGPT's train split) at each size N, on
the same answers: the ceiling of a larger or smaller draft vocabulary, known before training.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.eval_acceptance import heldout_prompts, parse_prompt_files  # noqa: E402
from scripts.target_greedy import cut, greedy_answers, stop_ids  # noqa: E402


def coverage(model, prompts, outs, masks: dict[str, torch.Tensor], stops: set[int]) -> dict:
    """Per draft vocabulary (name -> [V] bool `t2d`): token share (T=0) and probability mass
    (T=1) inside it, pooled over the answers (one target forward per answer for all of them)."""
    inside = dict.fromkeys(masks, 0)
    mass = dict.fromkeys(masks, 0.0)
    total = 0
    for p, o in zip(prompts, cut(outs, stops), strict=True):
        if not o:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([p + o])).logits[0, len(p) - 1 : len(p) - 1 + len(o)]
        probs = torch.softmax(logits.double(), dim=-1)
        for name, t2d in masks.items():
            inside[name] += int(t2d[torch.tensor(o)].sum())
            mass[name] += float(probs[:, t2d].sum())
        total += len(o)
    return {
        name: {
            "tokens": total,
            "t0_token_share": inside[name] / total,
            "t1_mass": mass[name] / total,
        }
        for name in masks
    }


def vocab_masks_from_counts(path: str, tokenizer, vocab_size: int, sizes: list[int]) -> dict:
    """The draft vocabularies `build_vocab_map` picks from the assistant turns of `path`."""
    from common.vocab import build_vocab_map
    from scripts.eval_acceptance import read_jsonl

    counts = torch.zeros(vocab_size, dtype=torch.int64)
    texts = [
        m["content"]
        for row in read_jsonl(path)
        for m in row["messages"]
        if m["role"] == "assistant" and m["content"]
    ]
    for i in range(0, len(texts), 1024):
        for ids in tokenizer(texts[i : i + 1024], add_special_tokens=False)["input_ids"]:
            counts += torch.bincount(torch.tensor(ids, dtype=torch.int64), minlength=vocab_size)
    return {f"counts_{n}": build_vocab_map(counts, n).t2d for n in sizes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", nargs="+", help="NAME=FILE held-out chat rows")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--counts-from", help="chat rows whose assistant turns rank the vocabulary")
    ap.add_argument("--vocab-sizes", type=int, nargs="*", default=[])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with safe_open(str(Path(a.draft) / "model.safetensors"), "pt") as f:
        t2d = f.get_tensor("t2d").bool()
    tok = AutoTokenizer.from_pretrained(a.target)
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).eval()
    stops = stop_ids(a.target)
    by_domain = heldout_prompts(
        a.target, tok, a.num_prompts, parse_prompt_files(a.prompts), a.max_prompt_tokens
    )
    masks = {"draft": t2d}
    if a.counts_from:
        masks |= vocab_masks_from_counts(a.counts_from, tok, len(t2d), a.vocab_sizes)
    res = {"draft_vocab_size": int(t2d.sum()), "target_vocab_size": len(t2d), "domains": {}}
    res["vocabularies"] = {name: int(m.sum()) for name, m in masks.items()}
    print("| domain | vocabulary | size | prompts | answer tokens | T=0 share in | T=1 mass in |")
    print("|---|---|---|---|---|---|---|")
    for domain, prompts in by_domain.items():
        outs = greedy_answers(model, prompts, a.max_tokens, batch=16)
        res["domains"][domain] = {"prompts": len(prompts)}
        for name, r in coverage(model, prompts, outs, masks, stops).items():
            res["domains"][domain][name] = r
            print(
                f"| {domain} | {name} | {res['vocabularies'][name]} | {len(prompts)} | "
                f"{r['tokens']} | {r['t0_token_share']:.4f} | {r['t1_mass']:.4f} |"
            )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
