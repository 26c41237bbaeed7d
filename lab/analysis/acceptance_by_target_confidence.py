"""Where a draft's T=0 misses fall against the target's own confidence: is acceptance held down
where the target is sure (the draft's fault, room to train) or where it is torn (near-ties no
draft can call)?

    python lab/analysis/acceptance_by_target_confidence.py \
        --target artifacts/smollm2-135m-instruct \
        --checkpoint DRAFT --prompts sharegpt=heldout.jsonl humaneval=humaneval.jsonl \
        --num-prompts 16 --max-tokens 128

The engine answers each prompt at T=0; one teacher-forced pass over prompt + answer
(`scripts/teacher_forced_acceptance.py: slot_hits`) gives, for every anchor and slot, whether the
draft proposes the target's token, and the target's top-1 probability for that token's position
(its softmax at T=1, from the same pass). Per bin of that probability: the share of (anchor,
slot) cells, the draft's agreement there (the same for slot 0 alone), and the share of the
engine's rounds (the walk from the first answer token) that end on a miss in that bin. Last, the
acceptance length the walk would reach if the draft agreed wherever the target's top-1
probability is at least each bin's floor: what training could still win at confident positions,
against what is left to near-ties. Beside the bins, the reduced draft vocabulary's part: the share
of answer tokens outside it (no draft over it can propose them), the share of rounds ending on
such a token, and the walk if the draft were right there too (a ceiling for a larger or rebuilt
vocabulary; a full-vocabulary draft has none outside).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.target import target_head_weights, target_logit_softcap  # noqa: E402
from scripts.eval_acceptance import evaluate, parse_runtime_args  # noqa: E402
from scripts.teacher_forced_acceptance import (  # noqa: E402
    add_teacher_args,
    greedy_engine_and_prompts,
    leading_matches,
    round_starts,
    slot_hits,
    walk,
)
from serve.engine import Engine  # noqa: E402

CHUNK = 256  # rows of [CHUNK, vocab] logits at a time


@torch.no_grad()
def top1_probability(final: torch.Tensor, lm_head: torch.Tensor, softcap: float | None):
    """[T] float32: the target's largest next-token probability after each position of `final`
    [T, H] (the distribution of the token at t + 1), computed CHUNK rows at a time."""
    out = []
    for rows in final.split(CHUNK):
        z = rows.float() @ lm_head.float().T
        if softcap:
            z = softcap * torch.tanh(z / softcap)
        out.append(z.softmax(-1).amax(-1))
    return torch.cat(out)


def bin_index(p: torch.Tensor, floors: list[float]) -> torch.Tensor:
    """Index of the bin [floors[i], floors[i + 1]) each probability falls in (floors[0] = 0)."""
    return torch.bucketize(p, torch.tensor(floors[1:], dtype=p.dtype), right=True)


def rounds_ending_on(cells: torch.Tensor, starts: list[tuple[int, int]]) -> int:
    """How many of the rounds (anchor, accepted) end on a miss at a cell marked in `cells`
    [A, Nd] bool: the slot after the accepted ones, where a round accepted fewer than Nd."""
    return sum(int(cells[p, a]) for p, a in starts if a < cells.shape[1])


def domain_row(engine: Engine, prompts, max_tokens: int, floors: list[float]) -> dict:
    """The bins and hypothetical walks of one domain's prompts (see the module docstring)."""
    _, lm_head = target_head_weights(engine.target_model)
    cap = target_logit_softcap(engine.target_model)
    answers = evaluate(engine, prompts, 0.0, max_tokens, 0)["outputs"]
    nb = len(floors)
    cells, agree, ends = torch.zeros(nb), torch.zeros(nb), torch.zeros(nb)
    cells0, agree0 = torch.zeros(nb), torch.zeros(nb)  # slot 0 alone
    rounds = accepted = 0
    if_sure = torch.zeros(nb)  # accepted drafts of the walk, draft right where target >= floor
    if_rounds = torch.zeros(nb)
    t2d = engine.draft_model.t2d.cpu()  # the draft vocabulary, over target ids
    tokens = tokens_out = ends_out = out_rounds = out_accepted = 0
    for prompt, answer in zip(prompts, answers, strict=True):
        hit, ids, label_pos, final = slot_hits(engine, prompt, answer)
        hit = hit.cpu()
        outside = ~t2d[ids[0].cpu()[label_pos.cpu()]]  # [A, Nd]: a token the draft cannot propose
        tokens, tokens_out = tokens + len(answer), tokens_out + int((~t2d[answer]).sum())
        conf = top1_probability(final[0], lm_head, cap).cpu()
        slot_conf = conf[(label_pos - 1).cpu()]  # [A, Nd]: for the token each slot proposes
        b = bin_index(slot_conf, floors)
        # the anchors a round can start from (a token after them), as teacher_forced_acceptance
        held, held_b = hit[:-1], b[:-1]
        for i in range(nb):
            sel = held_b == i
            cells[i] += sel.sum()
            agree[i] += (held & sel).sum()
            cells0[i] += sel[:, 0].sum()
            agree0[i] += (held & sel)[:, 0].sum()
        starts = round_starts(leading_matches(hit))
        rounds, accepted = rounds + len(starts), accepted + sum(a for _, a in starts)
        for p, a in starts:  # a round with a miss ends in its bin
            if a < hit.shape[1]:
                ends[int(b[p, a])] += 1
        ends_out += rounds_ending_on(outside, starts)
        n, k = walk(leading_matches(hit | outside))
        out_rounds, out_accepted = out_rounds + n, out_accepted + k
        for i, floor in enumerate(floors):
            n, k = walk(leading_matches(hit | (slot_conf >= floor)))
            if_rounds[i] += n
            if_sure[i] += k
    return {
        "prompts": len(prompts),
        "walk_tau": 1 + accepted / max(1, rounds),
        "answer_tokens_outside_draft_vocab": tokens_out / max(1, tokens),
        "round_ends_outside_draft_vocab": ends_out / max(1, int(ends.sum())),
        "walk_tau_if_right_outside_draft_vocab": 1 + out_accepted / max(1, out_rounds),
        "bins": [
            {
                "floor": floors[i],
                "ceiling": floors[i + 1] if i + 1 < nb else 1.0,
                "cell_share": float(cells[i] / cells.sum()),
                "draft_agreement": float(agree[i] / max(1, cells[i])),
                "slot0_share": float(cells0[i] / cells0.sum()),
                "slot0_draft_agreement": float(agree0[i] / max(1, cells0[i])),
                "round_end_share": float(ends[i] / max(1, ends.sum())),
                "walk_tau_if_right_where_target_at_least_floor": float(
                    1 + if_sure[i] / max(1, if_rounds[i])
                ),
            }
            for i in range(nb)
        ],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_teacher_args(ap, num_prompts=16)
    ap.add_argument(
        "--floors",
        type=float,
        nargs="+",
        default=[0.5, 0.8, 0.95],
        help="bin floors of the target's top-1 probability (a bin from 0 is added)",
    )
    a = parse_runtime_args(ap, argv)
    floors = [0.0, *sorted(f for f in a.floors if 0.0 < f < 1.0)]
    engine, prompts = greedy_engine_and_prompts(a)
    print(
        "| domain | target top-1 probability | share of slots | draft agrees | slot 0: share, "
        "draft agrees | rounds ending here | walk tau if the draft agreed wherever the target is "
        "at least this sure |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = []
    for dom, ps in sorted(prompts.items()):
        row = {"domain": dom, **domain_row(engine, ps, a.max_tokens, floors)}
        rows.append(row)
        for b in row["bins"]:
            print(
                f"| {dom} | {b['floor']:.2f}-{b['ceiling']:.2f} | {b['cell_share']:.3f} | "
                f"{b['draft_agreement']:.3f} | {b['slot0_share']:.3f}, "
                f"{b['slot0_draft_agreement']:.3f} | {b['round_end_share']:.3f} | "
                f"{b['walk_tau_if_right_where_target_at_least_floor']:.3f} |",
                flush=True,
            )
        print(f"| {dom} | walk tau as is | | | | | {row['walk_tau']:.3f} |", flush=True)
        print(
            f"| {dom} | outside the draft vocabulary | "
            f"{row['answer_tokens_outside_draft_vocab']:.3f} of answer tokens | | | "
            f"{row['round_ends_outside_draft_vocab']:.3f} | "
            f"{row['walk_tau_if_right_outside_draft_vocab']:.3f} |",
            flush=True,
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
