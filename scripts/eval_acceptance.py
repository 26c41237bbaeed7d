"""Realized acceptance of one or more drafts with the embedded engine, on held-out prompts.

    python scripts/eval_acceptance.py --target artifacts/tiny-target \
        --draft dspark=outputs/tiny/final --draft dflash=outputs/tiny_dflash/final \
        --temperatures 0 1 --num-prompts 24 --max-tokens 64 --json OUT.json

Prompts: each conversation up to its first assistant turn, rendered with the target's chat template
and a generation prompt; from `--prompts NAME=FILE` (one domain per file, e.g.
`sharegpt=heldout.jsonl humaneval=humaneval.jsonl`), or by default `TARGET/data/heldout.jsonl`
split by the row's `domain` field (code, prose). Prompts longer than `--max-prompt-tokens` are
skipped (counted in the report), so every domain fits the engine's context.

For each (draft, temperature, domain) it prints the pooled mean acceptance length (1 +
accepted/drafts, vLLM's definition) and per-position conditional acceptance (accepted at k /
reached k), plus the ratio of each draft's tau to the first draft's with its paired 95% bootstrap
interval over the prompts (every draft answers the same prompts; each row keeps its prompts'
[rounds, accepted] as `per_prompt`). Counters come from the
engine's vLLM-named stats; greedy output is lossless by construction (tests/unit/test_engine.py), so
only acceptance differs between drafts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.atomic_file import write_whole  # noqa: E402
from scripts.paired_interval import tau_ratio_interval  # noqa: E402
from serve.engine import Engine  # noqa: E402
from serve.engine.options import EngineOptions  # noqa: E402
from serve.engine.request import SamplingParams  # noqa: E402
from train.data.regenerate import regeneration_prompt  # noqa: E402


def read_jsonl(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def heldout_prompts(
    target: str, tokenizer, n: int, files: dict[str, str] | None = None, max_tokens: int = 10**9
) -> dict[str, list[list[int]]]:
    """Up to `n` prompts per domain (token ids), from `files` {domain: path} or, by default,
    TARGET/data/heldout.jsonl keyed by each row's `domain`. Prompts over `max_tokens` are skipped;
    `heldout_prompts.skipped` holds their count per domain."""
    sources = (
        [(dom, row) for dom, path in files.items() for row in read_jsonl(path)]
        if files
        else [
            (row.get("domain", "all"), row)
            for row in read_jsonl(str(Path(target) / "data" / "heldout.jsonl"))
        ]
    )
    by_domain: dict[str, list[list[int]]] = {}
    skipped: dict[str, int] = {}
    for dom, row in sources:
        if len(by_domain.setdefault(dom, [])) >= n:
            continue
        ids = tokenizer.apply_chat_template(
            regeneration_prompt(row), add_generation_prompt=True, return_dict=True
        )["input_ids"]
        if len(ids) > max_tokens:
            skipped[dom] = skipped.get(dom, 0) + 1
            continue
        by_domain[dom].append(list(ids))
    heldout_prompts.skipped = skipped
    return by_domain


def add_runtime_args(ap) -> None:
    """--device, --dtype, --threads and --json, shared by the acceptance scripts."""
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json")


def parse_runtime_args(ap, argv):
    """Parse, and apply --threads."""
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    return a


def parse_prompt_files(specs: list[str] | None) -> dict[str, str] | None:
    if not specs:
        return None
    pairs = [s.split("=", 1) for s in specs]
    bad = [s for s, p in zip(specs, pairs) if len(p) != 2 or not Path(p[1]).is_file()]
    if bad:
        raise SystemExit(f"--prompts takes NAME=FILE with an existing file; got {bad}")
    return dict(pairs)


def evaluate(engine: Engine, prompts, temperature: float, max_tokens: int, seed: int) -> dict:
    """Run `prompts` and report the spec-decode counters they added (`SpecDecodeStats.report`),
    each prompt's [rounds, drafts accepted] (`per_prompt`, in prompt order), and their output
    ids."""
    before = engine.stats.snapshot().spec
    params = [
        SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + i)
        for i in range(len(prompts))
    ]
    results = engine.generate_with_rounds(prompts, params)
    added = engine.stats.snapshot().spec.since(before)
    per_prompt = [[len(rounds), sum(rounds)] for _, rounds in results]
    return {**added.report(), "per_prompt": per_prompt, "outputs": [ids for ids, _ in results]}


def shown_conditional(row: dict) -> str:
    """Per-position conditional acceptance, "-" where no round reached the position (a 0.00
    there would read as every draft rejected)."""
    pairs = zip(row["conditional_acceptance"], row["reached_per_pos"], strict=True)
    return " ".join(f"{c:.2f}" if n else "-" for c, n in pairs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="artifacts/tiny-target")
    ap.add_argument("--draft", action="append", required=True, help="NAME=CHECKPOINT_DIR")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--prompts", nargs="+", help="NAME=FILE: a domain's chat rows (.jsonl[.gz])")
    ap.add_argument("--num-prompts", type=int, default=24, help="per domain")
    ap.add_argument("--max-prompt-tokens", type=int, default=768)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="engine max_num_seqs")
    ap.add_argument(
        "--num-spec", type=int, default=None, help="drafts a round (default: the draft's block)"
    )
    ap.add_argument("--seed", type=int, default=0)
    add_runtime_args(ap)
    a = parse_runtime_args(ap, argv)
    files = parse_prompt_files(a.prompts)
    engines = {}
    for spec in a.draft:  # all loaded first: each (temperature, prompt set) runs every draft
        name, ckpt = spec.split("=", 1)
        engines[name] = Engine.from_options(
            EngineOptions(
                target=a.target,
                checkpoint=ckpt,
                device=a.device,
                dtype=a.dtype,
                draft_sampling="probabilistic",
                max_num_seqs=a.batch,
                max_model_len=a.max_prompt_tokens + a.max_tokens,
                num_speculative_tokens=a.num_spec,
                seed=a.seed,
            )
        )
    tokenizer = next(iter(engines.values())).tokenizer  # one target, one tokenizer
    prompts = heldout_prompts(a.target, tokenizer, a.num_prompts, files, a.max_prompt_tokens)
    if heldout_prompts.skipped:
        print(f"skipped prompts over {a.max_prompt_tokens} tokens: {heldout_prompts.skipped}")
    rows = []
    # Every draft on one prompt set before the next, the sets in the order given (the criterion's
    # first): an evaluation cut short keeps whole pairs, the one that matters first.
    for t in a.temperatures:
        for dom, ps in prompts.items():
            for name, engine in engines.items():
                r = evaluate(engine, ps, t, a.max_tokens, a.seed)
                r.pop("outputs")  # token ids: not part of the report
                rows.append(
                    {"draft": name, "temperature": t, "domain": dom, "prompts": len(ps), **r}
                )
                if a.json:  # the report so far, replaced whole: a cut-short run keeps its rows
                    write_whole(a.json, json.dumps(rows, indent=2))
                print(
                    f"{name:>8} T={t:<4} {dom:>6} tau={r['mean_acceptance_length']:.3f} "
                    "cond=" + shown_conditional(r),
                    flush=True,
                )
    first = [r for r in rows if r["draft"] == rows[0]["draft"]]
    base = {(r["temperature"], r["domain"]): r["mean_acceptance_length"] for r in first}
    print(
        "\n| draft | T | domain | tau (mean acceptance length) | tau / first draft's | "
        "95% interval (paired prompts) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["mean_acceptance_length"] / base[(r["temperature"], r["domain"])]
        ci = None if r["draft"] == rows[0]["draft"] else tau_ratio_interval([r], first)
        shown = "-" if ci is None else f"{ci['low']:.3f}-{ci['high']:.3f}"
        print(
            f"| {r['draft']} | {r['temperature']:g} | {r['domain']} | "
            f"{r['mean_acceptance_length']:.3f} | {ratio:.3f} | {shown} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
