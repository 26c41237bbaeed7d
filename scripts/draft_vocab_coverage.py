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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.eval_acceptance import heldout_prompts, parse_prompt_files  # noqa: E402


def answers(model, prompts: list[list[int]], max_tokens: int, pad: int, batch: int = 16):
    """The target's greedy continuation of each prompt (left-padded batches)."""
    out = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            g = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False
            )
        out += [row[width:].tolist() for row in g]
    return out


def coverage(model, prompts, outs, t2d: torch.Tensor, stops: set[int]) -> dict:
    """Token share (T=0) and probability mass (T=1) inside the draft vocabulary, pooled."""
    inside = total = 0
    mass = 0.0
    for p, o in zip(prompts, outs, strict=True):
        o = o[: next((k for k, t in enumerate(o) if t in stops), len(o))]
        if not o:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([p + o])).logits[0, len(p) - 1 : len(p) - 1 + len(o)]
        probs = torch.softmax(logits.double(), dim=-1)
        inside += int(t2d[torch.tensor(o)].sum())
        mass += float(probs[:, t2d].sum())
        total += len(o)
    return {"tokens": total, "t0_token_share": inside / total, "t1_mass": mass / total}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", nargs="+", help="NAME=FILE held-out chat rows")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    with safe_open(str(Path(a.draft) / "model.safetensors"), "pt") as f:
        t2d = f.get_tensor("t2d").bool()
    tok = AutoTokenizer.from_pretrained(a.target)
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).eval()
    eos = GenerationConfig.from_pretrained(a.target).eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    pad = model.generation_config.pad_token_id or 0
    by_domain = heldout_prompts(
        a.target, tok, a.num_prompts, parse_prompt_files(a.prompts), a.max_prompt_tokens
    )
    res = {"draft_vocab_size": int(t2d.sum()), "target_vocab_size": len(t2d), "domains": {}}
    print(
        "| domain | prompts | answer tokens | T=0 share in draft vocab | T=1 mass in draft vocab |"
    )
    print("|---|---|---|---|---|")
    for name, prompts in by_domain.items():
        outs = answers(model, prompts, a.max_tokens, pad)
        r = {"prompts": len(prompts), **coverage(model, prompts, outs, t2d, stops)}
        res["domains"][name] = r
        print(
            f"| {name} | {r['prompts']} | {r['tokens']} | {r['t0_token_share']:.4f} | "
            f"{r['t1_mass']:.4f} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
