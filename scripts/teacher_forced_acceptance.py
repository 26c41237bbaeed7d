"""What the engine should realize at T=0, from one teacher-forced pass: an independent check of
serving against training, on a real target.

    python scripts/teacher_forced_acceptance.py --target artifacts/smollm2-135m-instruct \
        --checkpoint DRAFT --prompts sharegpt=heldout.jsonl --num-prompts 8 --max-tokens 128

At T=0 a round anchored at p accepts the longest prefix of drafts equal to the target's greedy
tokens, and within that prefix the Markov head has seen the true previous tokens. So the accepted
count of every round is fixed by the greedy text alone: one training-path pass
(`TargetCapture` + `forward_train` + `block_logits`, teacher-forced) over prompt + greedy answer
gives it at every answer position. Walking those counts from the first answer token (anchor, accept
a, next anchor a + 1 further on) gives the acceptance length the engine must realize; averaging
over every anchor gives the text's mean. The engine runs the same prompts at T=0 and its counters
are printed beside both: a gap between the walk and the engine is a serving bug, not the draft.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.model import block_label_positions  # noqa: E402
from common.target import TargetCapture  # noqa: E402
from scripts.eval_acceptance import (  # noqa: E402
    add_runtime_args,
    evaluate,
    heldout_prompts,
    parse_prompt_files,
    parse_runtime_args,
)
from serve.engine import Engine  # noqa: E402
from serve.engine.options import EngineOptions  # noqa: E402
from train.loop.walk_anchors import leading_matches, round_starts  # noqa: E402


@torch.no_grad()
def greedy_beyond(target, ids: torch.Tensor, n: int) -> torch.Tensor:
    """`ids` and the target's next `n` greedy tokens, past any end-of-text token: a round that
    drafts past the end (EOS, max_tokens) is still verified, and its accepted drafts counted, by
    the engine as by vLLM (0.34's scheduler counts accepted drafts from the sampled tokens before
    its stop check, and schedules whole draft blocks near max_tokens)."""
    for _ in range(n):
        nxt = target(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    return ids


@torch.no_grad()
def teacher_forced_pass(engine: Engine, ids: torch.Tensor, anchors: torch.Tensor):
    """(fo, capture): one training-path pass over `ids` [1, T] for blocks anchored at each of
    `anchors` [1, A] (`TargetCapture`, then `forward_train`, the Markov head fed the true previous
    tokens); fo is `forward_train`'s output (hidden, markov_input), capture
    the target's (aux, final hidden states)."""
    draft = engine.draft_model
    cap = TargetCapture(engine.target_model, draft.config.target_layer_ids)
    try:
        out = cap(ids)
    finally:
        cap.close()
    fo = draft.forward_train(out.aux, ids, anchors, torch.ones_like(anchors, dtype=torch.bool))
    return fo, out


@torch.no_grad()
def draft_guesses(engine: Engine, ids: torch.Tensor, anchors: torch.Tensor):
    """(guess [A, Nd] target ids, fo, capture): the draft's greedy token in every slot of a block
    anchored at each of `anchors` ([1, A] positions in `ids` [1, T]), from `teacher_forced_pass`
    and `block_logits`."""
    draft = engine.draft_model
    fo, out = teacher_forced_pass(engine, ids, anchors)
    guess = draft.map_draft_to_target(draft.block_logits(fo.hidden, fo.markov_input).argmax(-1))
    return guess[0], fo, out


@torch.no_grad()
def slot_hits(engine: Engine, prompt: list[int], answer: list[int]):
    """(hit [len(answer), Nd] bool, ids [1, T], label_pos [len(answer), Nd], final [1, T, H]):
    whether the draft's greedy token in slot k of a round anchored at each answer position
    (anchor p = prompt length + i holds answer[i]) equals the target's token there, with the
    Markov head fed the true previous tokens; ids are the answer followed by the target's own
    greedy tokens past its end, label_pos where each slot's token sits in ids, final the
    target's final (post-norm) hidden states over ids: its logits at t - 1 give the token at t."""
    ids = greedy_beyond(
        engine.target_model, torch.tensor([prompt + answer], device=engine.device), engine.num_spec
    )
    lp = len(prompt)
    anchors = torch.arange(lp, lp + len(answer), device=ids.device).unsqueeze(0)
    guess, _, out = draft_guesses(engine, ids, anchors)
    label_pos, in_range = slot_labels(anchors, engine.num_spec, ids.shape[1])
    hit = (guess == ids[0, label_pos]) & in_range
    return hit, ids, label_pos, out.final


def slot_labels(anchors: torch.Tensor, num_spec: int, seq_len: int):
    """(label_pos, in_range), each [A, Nd], of one row's anchors [1, A]: where slot k of the round
    at each anchor finds its token, and whether that lies inside the sequence."""
    valid = torch.ones_like(anchors, dtype=torch.bool)
    label_pos, in_range = block_label_positions(anchors, valid, num_spec, seq_len)
    return label_pos[0], in_range[0]


def accepted_counts(engine: Engine, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """[len(answer)] drafts a T=0 round anchored at each answer position would accept, against
    the answer followed by the target's own greedy tokens past its end."""
    return leading_matches(slot_hits(engine, prompt, answer)[0])


def conditional_acceptance(counts: torch.Tensor, nd: int) -> list[float]:
    """Per slot k < nd, the share of rounds reaching slot k (accepted >= k) that accept it, from
    each round's accepted count ([R] int)."""
    return [float((counts > k).sum() / max(1, int((counts >= k).sum()))) for k in range(nd)]


def walk(counts: torch.Tensor) -> tuple[int, int]:
    """(rounds, accepted) of the engine's path over an answer of len(counts) tokens."""
    starts = round_starts(counts)
    return len(starts), sum(a for _, a in starts)


def add_teacher_args(ap: argparse.ArgumentParser, num_prompts: int) -> None:
    """The arguments of a teacher-forced analysis: target, draft, prompt files and lengths."""
    ap.add_argument("--target", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--prompts", nargs="+", required=True, help="NAME=FILE chat rows")
    ap.add_argument("--num-prompts", type=int, default=num_prompts, help="per domain")
    ap.add_argument("--max-prompt-tokens", type=int, default=768)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    add_runtime_args(ap)


def greedy_engine(a, max_new_tokens: int, max_num_seqs: int = 8) -> Engine:
    """The engine with greedy drafting for `a`'s target, draft, device and dtype, with room for
    prompts of `a.max_prompt_tokens` and `max_new_tokens` more."""
    return Engine.from_options(
        EngineOptions(
            target=a.target,
            checkpoint=a.checkpoint,
            device=a.device,
            dtype=a.dtype,
            draft_sampling="greedy",
            max_num_seqs=max_num_seqs,
            max_model_len=a.max_prompt_tokens + max_new_tokens,
        )
    )


def greedy_engine_and_prompts(a) -> tuple[Engine, dict[str, list[list[int]]]]:
    """The engine with greedy drafting for `a`'s target and draft, and `a`'s prompts per domain."""
    engine = greedy_engine(a, a.max_tokens, a.batch)
    prompts = heldout_prompts(
        a.target,
        engine.tokenizer,
        a.num_prompts,
        parse_prompt_files(a.prompts),
        a.max_prompt_tokens,
    )
    return engine, prompts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_teacher_args(ap, num_prompts=8)
    a = parse_runtime_args(ap, argv)
    engine, prompts = greedy_engine_and_prompts(a)
    nd = engine.num_spec
    rows = []
    print("| domain | prompts | engine tau | walk tau | all-anchor tau | per-slot (all anchors) |")
    print("|---|---|---|---|---|---|")
    for dom, ps in sorted(prompts.items()):
        r = evaluate(engine, ps, 0.0, a.max_tokens, 0)
        rounds = acc = 0
        per_anchor = []
        for prompt, out in zip(ps, r["outputs"], strict=True):
            c = accepted_counts(engine, prompt, out)
            n, k = walk(c)
            rounds, acc = rounds + n, acc + k
            per_anchor.append(c[:-1])  # the anchors a round could start from
        allc = torch.cat(per_anchor).float()
        slots = conditional_acceptance(allc, nd)
        row = {
            "domain": dom,
            "prompts": len(ps),
            "engine_tau": r["mean_acceptance_length"],
            "engine_conditional": r["conditional_acceptance"],
            "walk_tau": 1 + acc / max(1, rounds),
            "walk_rounds": rounds,
            "every_anchor_tau": 1 + float(allc.mean()),
            "every_anchor_conditional": slots,
        }
        rows.append(row)
        print(
            f"| {dom} | {len(ps)} | {row['engine_tau']:.3f} | {row['walk_tau']:.3f} | "
            f"{row['every_anchor_tau']:.3f} | " + " ".join(f"{x:.2f}" for x in slots) + " |",
            flush=True,
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
