"""How much of a DSpark draft's Markov head carries from its training answers to held-out ones:
T=0 acceptance, teacher-forced over the target's own greedy answers, with the head's logit bias
scaled by each of a list of factors (0 is the draft's backbone alone, 1 the draft as trained).

    python lab/analysis/markov_bias_scale.py --target artifacts/smollm2-135m-instruct \
        --checkpoint DRAFT --rows answers.greedy.jsonl --splits heldout train --num-rows 48 \
        --scales 0 0.5 0.75 1 1.25 [--ranks 64 128 192]

Each row is a chat whose last assistant turn is the target's greedy answer (smollm2_regenerate.sh
output, whose `split` field names train or heldout). One target pass captures the hidden states;
one draft pass over a round anchored at every answer position gives the backbone's logits and the
head's bias apart (`lm_head(h) + markov_w2(u)`), so every scale costs one argmax. At T=0 a round
accepts the leading drafts equal to the answer's tokens, and within them the head has seen the
true previous tokens, so 1 + the mean leading matches over every anchor is the acceptance length
a T=0 round would realize there (scripts/teacher_forced_acceptance.py checks that walk against
the engine). Anchors whose block runs past the answer's end are left out.
A head that learned what generalizes helps held-out rows about as much as training rows; a head
that memorized training transitions helps training rows far more, and a scale below 1 may then
serve held-out rows better than the head as trained.

`--ranks K...` adds a column a K: the head cut to its K strongest directions. Its bias is a
bigram table of rank r, B = W1 W2^T (a row per previous token); the cut keeps the best rank-K
approximation of B with each row weighted by how often its token precedes a draft slot in the
file's train answers (`--weight-rows` of them, counts + 1), so the directions the text uses
most are kept. If cutting to K < r costs little, the head does not use its rank; if it costs
much, a wider head has room to gain.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.eval_acceptance import add_runtime_args, parse_runtime_args, read_jsonl  # noqa: E402
from scripts.teacher_forced_acceptance import (  # noqa: E402
    conditional_acceptance,
    greedy_engine,
    leading_matches,
    slot_labels,
    teacher_forced_pass,
)
from serve.engine import Engine  # noqa: E402
from train.data.regenerate import regeneration_prompt  # noqa: E402


def answer_tokens(tokenizer, row: dict) -> list[int]:
    """The ids of a row's last message, the assistant's answer."""
    return tokenizer(row["messages"][-1]["content"], add_special_tokens=False)["input_ids"]


def answer_ids(tokenizer, row: dict, max_prompt: int, max_answer: int):
    """(prompt ids, answer ids) of a row whose last message is the assistant's answer, or None
    where the prompt is longer than `max_prompt` or the answer has no full block."""
    prompt = tokenizer.apply_chat_template(
        regeneration_prompt(row), add_generation_prompt=True, return_dict=True
    )["input_ids"]
    answer = answer_tokens(tokenizer, row)
    if len(prompt) > max_prompt:
        return None
    return list(prompt), list(answer[:max_answer])


@torch.no_grad()
def base_and_bias(engine: Engine, prompt: list[int], answer: list[int]):
    """(base [A, Nd, Vd], bias [A, Nd, Vd], labels [A, Nd] target ids, u [A, Nd, r] the head's
    input W1[prev]) over the anchors of `answer` whose block ends inside it; the draft's logits
    are base + bias, and bias = u W2^T."""
    draft, nd = engine.draft_model, engine.num_spec
    ids = torch.tensor([prompt + answer], device=engine.device)
    lp, t = len(prompt), ids.shape[1]
    anchors = torch.arange(lp, t - nd, device=ids.device).unsqueeze(0)
    fo, _ = teacher_forced_pass(engine, ids, anchors)
    h, u = fo.hidden[0], fo.markov_input[0].to(fo.hidden.dtype)
    base = h @ draft.lm_head.weight.T.to(h.dtype)
    bias = u @ draft.markov_head.markov_w2.weight.T.to(h.dtype)
    label_pos, _ = slot_labels(anchors, nd, t)
    return base, bias, ids[0, label_pos], u


def rank_cut_map(w1: torch.Tensor, w2: torch.Tensor, rank: int, weights: torch.Tensor):
    """(P [r, Vd], share): u P is the bias of the head cut to rank `rank`, for u = W1[prev].
    B = W1 W2^T; with D = diag(weights), D^1/2 B_k is the best rank-k approximation of D^1/2 B
    (Eckart-Young), so B_k = W1 R1^-1 U_k S_k V_k^T Q2^T, where D^1/2 W1 = Q1 R1, W2 = Q2 R2 and
    R1 R2^T = U S V^T. `share`: the weighted energy the cut keeps, sum S_k^2 / sum S^2. float64;
    needs weights > 0 on at least r rows and W1, W2 of full rank r."""
    w1, w2 = w1.double(), w2.double()
    _, r1 = torch.linalg.qr(w1 * weights.double().sqrt()[:, None])
    q2, r2 = torch.linalg.qr(w2)
    u, s, vh = torch.linalg.svd(r1 @ r2.T)
    core = torch.linalg.solve_triangular(r1, u[:, :rank] * s[:rank], upper=True)
    share = float((s[:rank] ** 2).sum() / (s**2).sum())
    return core @ vh[:rank] @ q2.T, share


def prev_token_weights(tokenizer, rows: list[dict], vocab: int) -> torch.Tensor:
    """[vocab] counts + 1 of the answer tokens of `rows` (a draft slot's previous token is an
    answer token, or the anchor, which is one too)."""
    counts = torch.ones(vocab, dtype=torch.float64)
    for row in rows:
        ids = torch.tensor(answer_tokens(tokenizer, row), dtype=torch.long)
        counts += torch.bincount(ids, minlength=vocab)[:vocab]
    return counts


def scaled_matches(engine: Engine, base, bias, labels, scale: float) -> torch.Tensor:
    """[A] drafts a T=0 round at each anchor accepts with the bias scaled by `scale`."""
    guess = engine.draft_model.map_draft_to_target((base + scale * bias).argmax(-1))
    return leading_matches(guess == labels)


def rank_cuts(engine: Engine, rows: list[dict], ranks: list[int], weight_rows: int, path: str):
    """{rank: (P, energy share)} for `--ranks`, weighted by the file's train answers."""
    if not ranks:
        return {}
    head = engine.draft_model.markov_head
    w1, w2 = head.markov_w1.weight.detach(), head.markov_w2.weight.detach()
    bad = [k for k in ranks if not 1 <= k <= w1.shape[1]]
    if bad:
        raise SystemExit(f"--ranks {bad}: the head's rank is {w1.shape[1]}; each cut is 1..that")
    train = [r for r in rows if r.get("split") == "train"][:weight_rows]
    if not train:
        raise SystemExit(f"{path}: no rows with split='train' to weight --ranks by")
    weights = prev_token_weights(engine.tokenizer, train, w1.shape[0])
    return {k: rank_cut_map(w1, w2, k, weights) for k in ranks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--rows", required=True, help="chat rows with the target's answers (jsonl)")
    ap.add_argument("--splits", nargs="+", default=["heldout", "train"])
    ap.add_argument("--num-rows", type=int, default=48, help="per split, the first in the file")
    ap.add_argument("--scales", type=float, nargs="+", default=[0.0, 0.5, 0.75, 1.0, 1.25])
    ap.add_argument("--ranks", type=int, nargs="*", default=[], help="the head cut to each rank")
    ap.add_argument("--weight-rows", type=int, default=1000, help="train rows that weight --ranks")
    ap.add_argument("--max-prompt-tokens", type=int, default=768)
    ap.add_argument("--max-answer-tokens", type=int, default=512)
    add_runtime_args(ap)
    a = parse_runtime_args(ap, argv)
    engine = greedy_engine(a, a.max_answer_tokens)
    if engine.draft_model.markov_head is None:
        raise SystemExit(f"{a.checkpoint}: no Markov head (a DFlash draft); nothing to scale")
    nd = engine.num_spec
    rows = read_jsonl(a.rows)
    cuts = rank_cuts(engine, rows, a.ranks, a.weight_rows, a.rows)
    # every column: (group, key, the bias it drafts with, from the head's bias and its input u)
    variants = [("scales", str(s), lambda bias, u, s=s: s * bias) for s in a.scales]
    variants += [
        ("ranks", str(k), lambda bias, u, m=m: u @ m.to(u.dtype)) for k, (m, _) in cuts.items()
    ]
    results = []
    names = [f"x{s:g}" for s in a.scales] + [f"r{k} ({cuts[k][1]:.3f})" for k in a.ranks]
    print("| split | rows | anchors | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for split in a.splits:
        picked = [r for r in rows if r.get("split") == split][: a.num_rows]
        if not picked:
            raise SystemExit(f"{a.rows}: no rows with split={split!r}")
        counts = {(group, key): [] for group, key, _ in variants}
        used = 0
        for row in picked:
            pa = answer_ids(engine.tokenizer, row, a.max_prompt_tokens, a.max_answer_tokens)
            if pa is None or len(pa[1]) <= nd:
                continue
            used += 1
            base, bias, labels, u = base_and_bias(engine, *pa)
            for group, key, drafted in variants:
                counts[group, key].append(
                    scaled_matches(engine, base, drafted(bias, u), labels, 1.0)
                )
        res = {"split": split, "rows": used, "scales": {}, "ranks": {}}
        for (group, key), per_row in counts.items():
            c = torch.cat(per_row).float()
            res["anchors"] = int(c.numel())
            res[group][key] = {
                "tau": 1 + float(c.mean()),
                "conditional": conditional_acceptance(c, nd),
            }
        for k, (_, share) in cuts.items():
            res["ranks"][str(k)]["energy_share"] = share
        results.append(res)
        cells = " | ".join(f"{res[group][key]['tau']:.3f}" for group, key, _ in variants)
        print(f"| {split} | {used} | {res['anchors']} | {cells} |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
