"""Where a draft agrees with its target along a dataset's answers: per-slot argmax agreement over
the first N answer tokens, teacher-forced, one conversation at a time (no packing).

    python lab/analysis/answer_agreement.py --target artifacts/smollm2-135m-instruct \
        --checkpoint DRAFT --rows heldout.jsonl --num-rows 32 --answer-tokens 128 512

Each row is the conversation before its first assistant turn (chat template, generation prompt)
and that assistant turn.
At every answer position p, slot k of the block anchored at p proposes the token at p + k + 1;
it agrees when that is the target's argmax after the true tokens up to p + k, which at T=0 is
what a verifier accepts once slots before it were. The training path computes it (`TargetCapture`,
`forward_train`, `block_logits`, the Markov head fed the true previous tokens), as the trainer's
held-out `greedy_acceptance_per_pos` does over packed rows, so the two can be compared directly;
with `--answer-tokens` the answer is cut to its first N tokens, the part a served request of N
new tokens meets. Several N print one row each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.eval_acceptance import (  # noqa: E402
    add_runtime_args,
    parse_runtime_args,
    read_jsonl,
)
from scripts.teacher_forced_acceptance import draft_guesses, slot_labels  # noqa: E402
from serve.engine import Engine  # noqa: E402
from serve.engine.options import EngineOptions  # noqa: E402
from train.data.regenerate import regeneration_prompt  # noqa: E402


@torch.no_grad()
def slot_agreement(engine: Engine, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """[len(answer) - 1, Nd] int: 1 where slot k of the block anchored at answer position i
    proposes the target's argmax, 0 where not, -1 where the slot's token lies past the answer."""
    ids = torch.tensor([prompt + answer], device=engine.device)
    greedy = engine.target_model(input_ids=ids).logits[0].argmax(-1)  # [T]: argmax for t + 1
    lp, n = len(prompt), ids.shape[1]
    anchors = torch.arange(lp, n - 1, device=ids.device).unsqueeze(0)
    guess, _, _ = draft_guesses(engine, ids, anchors)
    label_pos, in_range = slot_labels(anchors, engine.num_spec, n)
    pos = label_pos.clamp(1, n - 1)  # the position each slot proposes a token for
    hit = (guess == greedy[pos - 1]).long()
    return torch.where(in_range, hit, torch.full_like(hit, -1))


def first_tokens(hits: torch.Tensor, n: int) -> torch.Tensor:
    """`slot_agreement`'s [A, Nd] for an answer cut to its first `n` tokens: anchors 0..n-2, and
    -1 where a slot's token (answer index anchor + slot + 1) lies at or past n."""
    h = hits[: max(0, n - 1)].clone()
    idx = torch.arange(h.shape[0]).unsqueeze(1) + torch.arange(1, h.shape[1] + 1)
    h[idx >= n] = -1
    return h


def rows_as_pairs(tokenizer, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    pairs = []
    for row in rows:
        asked = regeneration_prompt(row)
        reply = row["messages"][len(asked)] if len(asked) < len(row["messages"]) else None
        if not asked or reply is None or not reply.get("content"):
            continue
        prompt = tokenizer.apply_chat_template(asked, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
        answer = tokenizer(reply["content"], add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token_id
        pairs.append((list(prompt), answer + ([eos] if eos is not None else [])))
    return pairs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--rows", required=True, help="chat rows (jsonl) whose answers are scored")
    ap.add_argument("--num-rows", type=int, default=32)
    ap.add_argument("--answer-tokens", type=int, nargs="+", default=[128, 10**9])
    add_runtime_args(ap)
    a = parse_runtime_args(ap, argv)
    engine = Engine.from_options(
        EngineOptions(target=a.target, checkpoint=a.checkpoint, device=a.device, dtype=a.dtype)
    )
    pairs = rows_as_pairs(engine.tokenizer, read_jsonl(a.rows))[: a.num_rows]
    if not pairs:
        print(
            f"answer_agreement: no row of {a.rows} has a user and an assistant turn",
            file=sys.stderr,
        )
        return 2
    full = [slot_agreement(engine, p, ans).cpu() for p, ans in pairs]
    out = []
    print("| answer tokens | rows | anchors | per-slot agreement |")
    print("|---|---|---|---|")
    for n in a.answer_tokens:
        h = torch.cat([first_tokens(h, n) for h in full])
        seen = (h >= 0).sum(0)
        rate = ((h == 1).sum(0) / seen.clamp(min=1)).tolist()
        row = {"answer_tokens": n, "rows": len(pairs), "anchors": int(seen[0]), "per_slot": rate}
        out.append(row)
        label = "all" if n >= 10**9 else str(n)
        rates = " ".join(f"{x:.3f}" for x in rate)
        print(f"| {label} | {len(pairs)} | {row['anchors']} | {rates} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows_file": a.rows, "results": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
