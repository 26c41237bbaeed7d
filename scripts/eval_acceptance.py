"""Realized acceptance of one or more drafts with the embedded engine, on held-out prompts.

    python scripts/eval_acceptance.py --target artifacts/tiny-target \
        --draft dspark=outputs/tiny/final --draft dflash=outputs/tiny_dflash/final \
        --temperatures 0 1 --num-prompts 24 --max-tokens 64 --json OUT.json

Prompts: the user turns of `TARGET/data/heldout.jsonl`, split by the row's `domain` field (code,
prose), rendered with the target's chat template. For each (draft, temperature, domain) it prints
the pooled mean acceptance length (1 + accepted/drafts, vLLM's definition) and per-position
conditional acceptance (accepted at k / reached k), plus the ratio of each draft's tau to the
first draft's. Counters come from the engine's vLLM-named stats; greedy output is lossless by
construction (tests/test_engine.py), so only acceptance differs between drafts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serve.engine import Engine  # noqa: E402
from serve.engine.options import EngineOptions  # noqa: E402
from serve.engine.request import SamplingParams  # noqa: E402


def heldout_prompts(target: str, tokenizer, n: int) -> dict[str, list[list[int]]]:
    by_domain: dict[str, list[list[int]]] = {}
    for line in (Path(target) / "data" / "heldout.jsonl").read_text().splitlines():
        row = json.loads(line)
        dom = row.get("domain", "all")
        if len(by_domain.setdefault(dom, [])) >= n:
            continue
        msgs = [m for m in row["messages"] if m["role"] != "assistant"][:2]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)
        by_domain[dom].append(list(ids["input_ids"]))
    return by_domain


def evaluate(engine: Engine, prompts, temperature: float, max_tokens: int, seed: int) -> dict:
    """Run `prompts` and report the spec-decode counters they added (`SpecDecodeStats.report`)
    plus their output ids."""
    before = engine.stats.snapshot().spec
    params = [
        SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + i)
        for i in range(len(prompts))
    ]
    outputs = engine.generate(prompts, params)
    added = engine.stats.snapshot().spec.since(before)
    return {**added.report(), "outputs": outputs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="artifacts/tiny-target")
    ap.add_argument("--draft", action="append", required=True, help="NAME=CHECKPOINT_DIR")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--num-prompts", type=int, default=24, help="per domain")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="engine max_num_seqs")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = []
    for spec in a.draft:
        name, ckpt = spec.split("=", 1)
        engine = Engine.from_options(
            EngineOptions(
                target=a.target,
                checkpoint=ckpt,
                device=a.device,
                dtype=a.dtype,
                draft_sampling="probabilistic",
                max_num_seqs=a.batch,
                max_model_len=1024,
                seed=a.seed,
            )
        )
        prompts = heldout_prompts(a.target, engine.tokenizer, a.num_prompts)
        for t in a.temperatures:
            for dom, ps in sorted(prompts.items()):
                r = evaluate(engine, ps, t, a.max_tokens, a.seed)
                r.pop("outputs")  # token ids: not part of the report
                rows.append({"draft": name, "temperature": t, "domain": dom, **r})
                print(
                    f"{name:>8} T={t:<4} {dom:>6} tau={r['mean_acceptance_length']:.3f} "
                    f"cond=" + " ".join(f"{x:.2f}" for x in r["conditional_acceptance"]),
                    flush=True,
                )
    base = {
        (r["temperature"], r["domain"]): r["mean_acceptance_length"]
        for r in rows
        if r["draft"] == rows[0]["draft"]
    }
    print("\n| draft | T | domain | tau (mean acceptance length) | tau / first draft's |")
    print("|---|---|---|---|---|")
    for r in rows:
        ratio = r["mean_acceptance_length"] / base[(r["temperature"], r["domain"])]
        print(
            f"| {r['draft']} | {r['temperature']:g} | {r['domain']} | "
            f"{r['mean_acceptance_length']:.3f} | {ratio:.3f} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
