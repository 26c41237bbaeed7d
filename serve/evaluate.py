"""Acceptance of one or more DSpark drafts, served by the embedded engine on held-out prompts.

    python -m serve.evaluate --target DIR --draft NAME=CKPT [--draft NAME=CKPT ...] \
        --prompts DOMAIN=FILE [--prompts DOMAIN=FILE ...] --out DIR \
        [--temperatures 0 1] [--max-new-tokens N] [--num-spec K] [--seed S] [--max-prompts N]

Prompt files are JSONL (.gz too) rows with `messages` (a chat: the turns before the first
assistant reply, rendered with the target's chat template and a generation prompt) or `prompt`
(text, tokenized as is). Without --prompts: TARGET/data/heldout.jsonl, one domain per row's
`domain` field.

For each (draft, domain, temperature) OUT/eval.json holds, and the table shows:
- realized tau: tokens per verification round, pooled, sum(accepted + 1) / rounds (vLLM's mean
  acceptance length), with a 95% percentile bootstrap interval over prompts (a prompt's rounds
  are correlated; prompts are the independent unit);
- per-position conditional acceptance (accepted at k / rounds that reached k) and the counts;
- the analytic tau beside it: per slot, sum over the vocabulary of min(p_target, q_draft) (at T=0
  the indicator that the draft's argmax is the target's), pooled over every slot the engine
  verified, then chained (`common.acceptance.chain_tau`, the trainer's definition). It is read
  from the distributions the engine verified with, in the rounds it served;
- from the second draft on: tau over the first draft's on the same prompts, with the paired
  bootstrap interval.
`--speedup` also times target-only decoding against each draft at T=0 on the same prompts (no
analytic probe in either timed run) and reports the wall-time ratio.

eval.json is rewritten whole after every row, so a run cut short keeps what it measured. Request i
of a prompt set has seed S + i in every draft's run, so drafts answer the same sampled requests.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from common.acceptance import chain_tau, paired_tau_ratio, tau_interval
from common.atomic_file import write_whole
from common.sampling.gumbel import sampled_probs
from serve.engine import Engine
from serve.engine.options import EngineOptions, OptionsError
from serve.engine.request import SamplingParams

DESCRIPTION = __doc__.split("\n")[0]


class BadInput(ValueError):
    """A bad argument or prompt file: one line, exit code 2."""


# ------------------------------------------------------------------ prompts
def read_jsonl(path: str) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def prompt_ids(row: dict, tokenizer, where: str) -> list[int]:
    """Token ids of a row's prompt: `messages` up to the first assistant turn through the chat
    template (generation prompt added), or `prompt` text as is."""
    if isinstance(row.get("messages"), list) and row["messages"]:
        turns = []
        for m in row["messages"]:
            if m.get("role") == "assistant":
                break
            turns.append({"role": m["role"], "content": m["content"]})
        if not turns:
            raise BadInput(f"{where}: the conversation opens with an assistant turn; no prompt")
        out = tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_dict=True)
        return list(out["input_ids"])
    if isinstance(row.get("prompt"), str) and row["prompt"]:
        return list(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"])
    raise BadInput(f"{where}: a row needs `messages` (a chat) or `prompt` (text)")


def load_prompts(
    target: str, tokenizer, n: int, files: dict[str, str] | None = None, max_tokens: int = 10**9
) -> tuple[dict[str, list[list[int]]], dict[str, int]]:
    """({domain: up to `n` prompts' ids}, {domain: prompts skipped for exceeding `max_tokens`}),
    from `files` {domain: path} or TARGET/data/heldout.jsonl keyed by each row's `domain`."""
    if files:
        sources = [(d, row, f"{p}:{i + 1}") for d, p in files.items() for i, row in enum(p)]
    else:
        path = Path(target) / "data" / "heldout.jsonl"
        if not path.is_file():
            raise BadInput(f"no --prompts given and {path} does not exist: pass --prompts D=FILE")
        sources = [(row.get("domain", "all"), row, f"{path}:{i + 1}") for i, row in enum(path)]
    by_domain: dict[str, list[list[int]]] = {}
    skipped: dict[str, int] = {}
    for dom, row, where in sources:
        if len(by_domain.setdefault(dom, [])) >= n:
            continue
        ids = prompt_ids(row, tokenizer, where)
        if len(ids) > max_tokens:
            skipped[dom] = skipped.get(dom, 0) + 1
            continue
        by_domain[dom].append(ids)
    return by_domain, skipped


def enum(path) -> enumerate:
    return enumerate(read_jsonl(str(path)))


def parse_pairs(specs: list[str] | None, flag: str, must_exist: str) -> dict[str, str]:
    """NAME=PATH pairs, in order; a bad one is a BadInput naming it."""
    out: dict[str, str] = {}
    for s in specs or []:
        name, sep, path = s.partition("=")
        if not sep or not name or not path:
            raise BadInput(f"{flag} takes NAME=PATH; got {s!r}")
        p = Path(path)
        if not (p.is_file() if must_exist == "file" else p.is_dir()):
            raise BadInput(f"{flag} {s!r}: {path} is not an existing {must_exist}")
        if name in out:
            raise BadInput(f"{flag}: the name {name!r} is given twice")
        out[name] = path
    return out


# ------------------------------------------------------------------ the analytic probe
class AnalyticProbe:
    """Wraps an engine's sampler; at every verification adds, per draft slot the engine verified,
    sum(min(p_target, q_draft)) over the vocabulary: the probability that slot is accepted given
    the slots before it were (q: the distribution the draft sampled from, a point mass for argmax
    drafts; p: the target's at the request's temperature, one-hot at T=0)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.reset()

    def __getattr__(self, name):
        return getattr(self.sampler, name)

    def reset(self) -> None:
        self.sums: list[float] = []
        self.counts: list[int] = []

    def verify(self, target_logits, walk, temperature, seeds, first_pos, verify_len):
        r, n = walk.draft_ids.shape
        for k in range(n):
            rows = verify_len > k
            if not bool(rows.any()):
                continue
            p = sampled_probs(target_logits[:, k], temperature)
            if walk.draft_probs is not None:
                q = walk.draft_probs.row(k)
            else:
                q = torch.zeros_like(p).scatter_(1, walk.draft_ids[:, k : k + 1], 1.0)
            alpha = torch.minimum(p, q).sum(-1)[rows]
            while len(self.sums) <= k:
                self.sums.append(0.0)
                self.counts.append(0)
            self.sums[k] += float(alpha.double().sum())
            self.counts[k] += int(rows.sum())
        return self.sampler.verify(target_logits, walk, temperature, seeds, first_pos, verify_len)

    def per_pos(self) -> list[float]:
        return [s / c if c else 0.0 for s, c in zip(self.sums, self.counts, strict=True)]


# ------------------------------------------------------------------ running
def run_prompts(
    engine: Engine, prompts, temperature: float, max_tokens: int, seed: int, desc="", **extra
):
    """Every prompt to completion (request i seeded seed + i; `extra`: more SamplingParams), with
    a progress bar over prompts; -> [(output ids, [drafts accepted per round])] in prompt order."""
    ids = []
    for i, p in enumerate(prompts):
        sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + i, **extra)
        ids.append(engine.add_request(p, sp))
    out = {i: ([], []) for i in ids}
    left = set(ids)
    with tqdm(total=len(ids), desc=desc, unit="prompt", leave=False, file=sys.stderr) as bar:
        while left:
            for o in engine.step():
                if o.request_id in out:
                    out[o.request_id][0].extend(o.new_token_ids)
                    if o.num_accepted is not None:
                        out[o.request_id][1].append(o.num_accepted)
                    if o.finished and o.request_id in left:
                        left.discard(o.request_id)
                        bar.update()
    return [out[i] for i in ids]


def evaluate(engine: Engine, prompts, temperature: float, max_tokens: int, seed: int, desc=""):
    """One (draft, prompt set, temperature): the engine's spec-decode counters for these prompts
    (`SpecDecodeStats.report`), `per_prompt` [rounds, accepted], the analytic per-slot acceptance
    and tau, the interval of the realized tau, wall time, and the output ids (`outputs`)."""
    probe = engine.sampler if isinstance(engine.sampler, AnalyticProbe) else None
    if probe is not None:
        probe.reset()
    before = engine.stats.snapshot().spec
    t0 = time.perf_counter()
    results = run_prompts(engine, prompts, temperature, max_tokens, seed, desc)
    wall = time.perf_counter() - t0
    added = engine.stats.snapshot().spec.since(before)
    per_prompt = [[len(rounds), sum(rounds)] for _, rounds in results]
    row = {**added.report(), "per_prompt": per_prompt, "wall_s": wall}
    ci = tau_interval(per_prompt)
    row["tau_interval_95"] = None if ci is None else [ci["low"], ci["high"]]
    if probe is not None:
        alpha = probe.per_pos()
        row["analytic_acceptance_per_pos"] = alpha
        row["analytic_slots_per_pos"] = list(probe.counts)
        row["analytic_tau"] = chain_tau(alpha)
    row["output_tokens"] = sum(len(ids) for ids, _ in results)
    row["outputs"] = [ids for ids, _ in results]
    return row


def shown_conditional(row: dict) -> str:
    """Per-position conditional acceptance, "-" where no round reached the position (a 0.00
    there would read as every draft rejected)."""
    pairs = zip(row["conditional_acceptance"], row["reached_per_pos"], strict=True)
    return " ".join(f"{c:.2f}" if n else "-" for c, n in pairs)


def make_engine(a, checkpoint: str | None, probe: bool) -> Engine:
    engine = Engine.from_options(
        EngineOptions(
            target=a.target,
            checkpoint=checkpoint,
            device=a.device,
            dtype=a.dtype,
            draft_sampling="probabilistic",
            max_num_seqs=a.batch,
            max_model_len=a.max_prompt_tokens + a.max_new_tokens,
            num_speculative_tokens=a.num_spec if checkpoint else None,
            seed=a.seed,
        )
    )
    if probe:
        engine.sampler = AnalyticProbe(engine.sampler)
    return engine


def timed(engine: Engine, prompts, max_tokens: int, seed: int, desc: str) -> float:
    """Wall seconds of greedy decoding of `prompts`, after one untimed warm-up prompt."""
    run_prompts(engine, prompts[:1], 0.0, max_tokens, seed)
    t0 = time.perf_counter()
    run_prompts(engine, prompts, 0.0, max_tokens, seed, desc)
    return time.perf_counter() - t0


def speedups(a, engines: dict, prompts: dict) -> list[dict]:
    """Target-only vs each draft, T=0, same prompts and batch, wall time of each."""
    base = make_engine(a, None, probe=False)
    out = []
    for dom, ps in prompts.items():
        t_base = timed(base, ps, a.max_new_tokens, a.seed, f"target-only {dom}")
        for name, engine in engines.items():
            inner = engine.sampler
            engine.sampler = getattr(inner, "sampler", inner)  # no probe in a timed run
            try:
                t_spec = timed(engine, ps, a.max_new_tokens, a.seed, f"{name} {dom}")
            finally:
                engine.sampler = inner
            out.append(
                {
                    "draft": name,
                    "domain": dom,
                    "temperature": 0.0,
                    "prompts": len(ps),
                    "target_only_s": t_base,
                    "dspark_s": t_spec,
                    "speedup": t_base / t_spec,
                }
            )
    return out


# ------------------------------------------------------------------ report
def table(rows: list[dict]) -> list[str]:
    lines = [
        "| draft | T | domain | prompts | tau (tokens/round) | 95% interval | analytic tau | "
        "per-position acceptance | tau / first draft's (paired 95%) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = r["tau_interval_95"]
        shown_ci = "-" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}"
        ratio = r.get("vs_first")
        shown_ratio = "-"
        if ratio is not None:
            shown_ratio = f"{ratio['value']:.3f} ({ratio['low']:.3f}-{ratio['high']:.3f})"
        lines.append(
            f"| {r['draft']} | {r['temperature']:g} | {r['domain']} | {r['prompts']} | "
            f"{r['mean_acceptance_length']:.3f} | {shown_ci} | {r.get('analytic_tau', 0):.3f} | "
            f"{shown_conditional(r)} | {shown_ratio} |"
        )
    return lines


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m serve.evaluate", description=DESCRIPTION)
    ap.add_argument("--target", required=True, help="the target's HF folder")
    ap.add_argument("--draft", action="append", required=True, metavar="NAME=CKPT")
    ap.add_argument("--prompts", action="extend", nargs="+", metavar="DOMAIN=FILE")
    ap.add_argument("--out", required=True, help="folder for eval.json")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--num-spec", type=int, default=None, help="drafts a round (default: block's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompts", type=int, default=24, help="per domain")
    ap.add_argument("--max-prompt-tokens", type=int, default=768, help="longer prompts skipped")
    ap.add_argument("--batch", type=int, default=8, help="requests decoded together")
    ap.add_argument("--speedup", action="store_true", help="also time target-only vs each draft")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    for flag in ("max_new_tokens", "max_prompts", "max_prompt_tokens", "batch"):
        if getattr(a, flag) < 1:
            raise BadInput(f"--{flag.replace('_', '-')} must be at least 1")
    if a.num_spec is not None and a.num_spec < 1:
        raise BadInput("--num-spec must be at least 1")
    if not Path(a.target).is_dir():
        raise BadInput(f"--target {a.target}: not a folder")
    return a


def run(a) -> dict:
    """The whole evaluation of parsed arguments `a`; writes OUT/eval.json and returns it."""
    if a.threads:
        torch.set_num_threads(a.threads)
    drafts = parse_pairs(a.draft, "--draft", "folder")
    files = parse_pairs(a.prompts, "--prompts", "file") or None
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    engines = {name: make_engine(a, ckpt, probe=True) for name, ckpt in drafts.items()}
    tokenizer = next(iter(engines.values())).tokenizer
    if tokenizer is None:
        raise BadInput(f"--target {a.target} has no tokenizer to render prompts with")
    prompts, skipped = load_prompts(a.target, tokenizer, a.max_prompts, files, a.max_prompt_tokens)
    prompts = {d: ps for d, ps in prompts.items() if ps}
    if not prompts:
        raise BadInput(f"no prompt of at most {a.max_prompt_tokens} tokens in the prompt files")
    report = {
        "target": a.target,
        "drafts": drafts,
        "settings": {
            k: getattr(a, k)
            for k in ("temperatures", "max_new_tokens", "num_spec", "seed", "max_prompts")
        }
        | {"max_prompt_tokens": a.max_prompt_tokens, "batch": a.batch, "dtype": a.dtype},
        "skipped_prompts": skipped,
        "rows": [],
    }
    first = next(iter(drafts))
    for t in a.temperatures:
        for dom, ps in prompts.items():
            for name, engine in engines.items():
                r = evaluate(engine, ps, t, a.max_new_tokens, a.seed, f"{name} T={t:g} {dom}")
                r.pop("outputs")
                row = {"draft": name, "temperature": t, "domain": dom, "prompts": len(ps), **r}
                if name != first:
                    base = next(
                        x
                        for x in report["rows"]
                        if (x["draft"], x["temperature"], x["domain"]) == (first, t, dom)
                    )
                    row["vs_first"] = paired_tau_ratio(row["per_prompt"], base["per_prompt"])
                report["rows"].append(row)
                write_whole(out_dir / "eval.json", json.dumps(report, indent=2))
                print(
                    f"{name:>8} T={t:<4g} {dom:>8} tau={r['mean_acceptance_length']:.3f} "
                    f"analytic={r['analytic_tau']:.3f} cond={shown_conditional(r)}",
                    flush=True,
                )
    if a.speedup:
        report["speedup"] = speedups(a, engines, prompts)
        write_whole(out_dir / "eval.json", json.dumps(report, indent=2))
    return report


def main(argv=None) -> int:
    try:
        a = parse_args(argv)
        report = run(a)
    except (BadInput, OptionsError) as e:
        print(f"serve.evaluate: {e}", file=sys.stderr)
        return 2
    print("\n" + "\n".join(table(report["rows"])))
    for s in report.get("speedup", []):
        print(
            f"speed-up {s['draft']} {s['domain']} T=0: {s['speedup']:.2f}x "
            f"(target-only {s['target_only_s']:.1f} s, DSpark {s['dspark_s']:.1f} s, "
            f"{s['prompts']} prompts)"
        )
    print(f"\nwrote {Path(a.out) / 'eval.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
