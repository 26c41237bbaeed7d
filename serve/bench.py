"""`python -m serve.bench`: load-test any OpenAI-compatible server (ours or vLLM) and report
latency, throughput and pooled speculative-decoding acceptance.

Design choices:
- A fixed, deterministic prompt set (built in: code and prose; or `--prompts FILE`); request i
  sends prompt i mod len(prompts), so two runs against two servers send the same work.
- Streaming requests measure TTFT (first non-empty text chunk) and TPOT = (latency - TTFT) /
  (output tokens - 1), per request, as `vllm bench serve` does. Output tokens come from the
  stream's `usage` (`stream_options.include_usage`); a server without it is counted by chunks.
- Acceptance is pooled from `/metrics` deltas scraped before and after the run, never averaged
  per request, with the engine's own arithmetic (`serve.engine.stats.SpecDecodeStats`: mean
  acceptance length = 1 + accepted / drafts, per-position rate = accepted_per_pos[i] / drafts,
  acceptance rate = accepted / draft tokens, vLLM's formulas). Draft tokens are the ones
  scheduled (N per draft) on both servers; our engine also exports the drafts its target
  verified (`dspark:spec_decode_num_verified_draft_tokens`, fewer under adaptive verification),
  reported when present. `/metrics` is read with `prometheus_client.parser`; counters are
  summed over label sets (engines).
- Where the server reports each request's own acceptance in its last chunk
  (`metrics.speculative_decoding`: our engine always, vLLM >= 0.29 with
  `--per-request-spec-decode-metrics summary`, which `serve.launch` passes), the pooled mean
  acceptance length over those requests comes with a 95% bootstrap interval over requests
  (`common.acceptance.tau_interval`: a request's rounds are correlated, requests are not).
- Pure functions (`parse_spec_decode_metrics`, `spec_decode_delta`, `summarize`) hold all the
  arithmetic; the async client only times requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from common.acceptance import tau_interval
from serve.engine.stats import SpecDecodeStats, read_spec_counters

DEFAULT_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number using memoization.",
    "Explain, in a short paragraph, why the sky appears blue during the day.",
    'def quicksort(xs):\n    """Sort a list of integers."""\n',
    "Summarize the plot of a story about a lighthouse keeper who finds a message in a bottle.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Describe the water cycle to a ten-year-old.",
    "Implement a binary search over a sorted list in Rust and explain its complexity.",
    "Write a short, friendly email declining a meeting invitation for next Tuesday.",
    "class LRUCache:\n    def __init__(self, capacity: int):\n",
    "List five practical tips for writing clear technical documentation.",
    "Write a bash script that counts the lines of every .py file under the current directory.",
    "What are the main differences between a process and a thread? Answer briefly.",
    "Translate this JavaScript to Python: const sq = xs.map(x => x * x).filter(x => x > 10);",
    "Write a haiku about autumn rain on a city street.",
    "Write a unit test with pytest for a function `slugify(title: str) -> str`.",
    "Give a brief history of the printing press and its effect on literacy in Europe.",
)
# ---------------------------------------------------------------- /metrics

# The pooled counters of `SpecDecodeStats`, in its argument order.
SPEC_TOTALS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def parse_spec_decode_metrics(text: str) -> SpecDecodeStats | None:
    """The spec-decode counters of a Prometheus exposition (`read_spec_counters`), summed over
    label sets (engines); None if the server exports none of vLLM's (no speculative decoding,
    or not vLLM-compatible metrics); a counter it lacks counts 0."""
    r = read_spec_counters(text)
    totals = [r.totals.get(name) for name in SPEC_TOTALS]
    if not r.per_pos and all(t is None for t in totals):
        return None
    n = max(r.per_pos, default=-1) + 1
    drafts, draft_tokens, accepted = (t or 0 for t in totals)
    per_pos = [r.per_pos.get(k, 0) for k in range(n)]
    return SpecDecodeStats(n, drafts, draft_tokens, accepted, per_pos, r.verified)


def spec_decode_delta(before: SpecDecodeStats | None, after: SpecDecodeStats | None) -> dict | None:
    """Pooled acceptance over the run (after - before), by `SpecDecodeStats`' one arithmetic;
    rates are None (lists empty) when nothing was drafted. `num_draft_tokens` and
    `acceptance_rate` count scheduled drafts (vLLM's meaning); `num_verified_draft_tokens` is
    None unless the server exports it (our engine)."""
    if before is None or after is None:
        return None
    n = max(before.num_speculative_tokens, after.num_speculative_tokens)
    d = _padded(after, n).since(_padded(before, n))
    drafted = d.num_drafts > 0
    return {
        "num_drafts": d.num_drafts,
        "num_draft_tokens": d.num_draft_tokens,
        "num_verified_draft_tokens": d.num_verified_draft_tokens,
        "num_accepted_tokens": d.num_accepted_tokens,
        "accepted_per_pos": d.num_accepted_tokens_per_pos,
        "acceptance_rate": d.draft_acceptance_rate if d.num_draft_tokens > 0 else None,
        "mean_acceptance_length": d.mean_acceptance_length if drafted else None,
        "per_position_acceptance_rates": d.per_position_rate() if drafted else [],
    }


def _padded(s: SpecDecodeStats, n: int) -> SpecDecodeStats:
    """`s` with per-position counts for n positions (a position never reported counts 0)."""
    pos = s.num_accepted_tokens_per_pos + [0] * (n - len(s.num_accepted_tokens_per_pos))
    return SpecDecodeStats(
        n, s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, pos, s.num_verified_draft_tokens
    )


# ---------------------------------------------------------------- requests


@dataclass
class RequestResult:
    index: int
    ok: bool
    latency_s: float = 0.0
    ttft_s: float | None = None
    output_tokens: int = 0
    tokens_from_usage: bool = False
    error: str | None = None
    spec_rounds: int | None = None  # the server's own per-request acceptance, where it sends one
    spec_accepted: int | None = None


def tpot_s(r: RequestResult) -> float | None:
    """Time per output token after the first (decode, prefill timed apart); None for a request
    with no first token or a single one."""
    if not r.ok or r.ttft_s is None or r.output_tokens <= 1:
        return None
    return (r.latency_s - r.ttft_s) / (r.output_tokens - 1)


def summarize(results: list[RequestResult], duration_s: float) -> dict:
    """Throughput and latency over successful requests (TPOT only where output > 1 token), and
    each request's own figures (`requests`, by request index: two runs that sent the same
    prompts pair up request by request, for a paired interval on their ratio)."""
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [t for t in map(tpot_s, ok) if t is not None]
    total_out = sum(r.output_tokens for r in ok)

    def ms(values, fn):
        return fn(values) * 1000 if values else None

    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "total_output_tokens": total_out,
        "output_tokens_from_usage": all(r.tokens_from_usage for r in ok) if ok else None,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else None,
        "output_token_throughput": total_out / duration_s if duration_s > 0 else None,
        "mean_ttft_ms": ms(ttfts, statistics.fmean),
        "median_ttft_ms": ms(ttfts, statistics.median),
        "mean_tpot_ms": ms(tpots, statistics.fmean),
        "median_tpot_ms": ms(tpots, statistics.median),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "per_request_acceptance": per_request_acceptance(ok),
        "requests": [
            {
                "index": r.index,
                "output_tokens": r.output_tokens,
                "ttft_ms": _ms(r.ttft_s),
                "tpot_ms": _ms(tpot_s(r)),
                **(
                    {"spec_rounds": r.spec_rounds, "spec_accepted": r.spec_accepted}
                    if r.spec_rounds is not None
                    else {}
                ),
            }
            for r in sorted(ok, key=lambda r: r.index)
        ],
    }


def per_request_acceptance(ok: list[RequestResult]) -> dict | None:
    """{"mean_acceptance_length", "ci95": [low, high], "requests"}: 1 + accepted / rounds pooled
    over the requests whose server reported their own acceptance, with the bootstrap interval
    over those requests; None where none did (a server without per-request metrics)."""
    per = [[r.spec_rounds, r.spec_accepted] for r in ok if r.spec_rounds]
    ci = tau_interval(per)
    if ci is None:
        return None
    return {
        "mean_acceptance_length": ci["value"],
        "ci95": [ci["low"], ci["high"]],
        "requests": len(per),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _payload(api: str, model: str, prompt: str, max_tokens: int, temperature: float, extra):
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _chunk_text(obj: dict) -> str:
    choices = obj.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "text" in c:
        return c.get("text") or ""
    return (c.get("delta") or {}).get("content") or ""


async def _one_request(client: httpx.AsyncClient, url: str, body: dict, index: int):
    start = time.perf_counter()
    res = RequestResult(index=index, ok=False)
    chunks = 0
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:200]
                res.error = f"HTTP {resp.status_code}: {text}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if _chunk_text(obj):
                    if res.ttft_s is None:
                        res.ttft_s = time.perf_counter() - start
                    chunks += 1
                usage = obj.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    res.output_tokens = int(usage["completion_tokens"])
                    res.tokens_from_usage = True
                sd = (obj.get("metrics") or {}).get("speculative_decoding")
                if sd and sd.get("num_spec_steps") is not None:
                    res.spec_rounds = int(sd["num_spec_steps"])
                    res.spec_accepted = int(sd["num_accepted_draft_tokens"])
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.latency_s = time.perf_counter() - start
    if not res.tokens_from_usage:
        res.output_tokens = chunks
    res.ok = True
    return res


async def _fetch_metrics(client: httpx.AsyncClient, root: str) -> SpecDecodeStats | None:
    try:
        resp = await client.get(f"{root}/metrics")
    except httpx.HTTPError:
        return None
    return parse_spec_decode_metrics(resp.text) if resp.status_code == 200 else None


def split_base_url(base_url: str) -> tuple[str, str]:
    """-> (server root for /metrics, API base ending in /v1)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return root, root + "/v1"


async def run_benchmark(
    base_url: str,
    model: str | None,
    prompts: list[str],
    *,
    concurrency: int,
    num_prompts: int,
    max_tokens: int = 128,
    temperature: float = 0.0,
    api: str = "completions",
    extra_body: dict | None = None,
    timeout_s: float = 600.0,
) -> dict:
    root, api_base = split_base_url(base_url)
    url = f"{api_base}/{'chat/completions' if api == 'chat' else 'completions'}"
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        if model is None:
            resp = await client.get(f"{api_base}/models")
            resp.raise_for_status()
            model = resp.json()["data"][0]["id"]
        before = await _fetch_metrics(client, root)
        results: list[RequestResult] = []
        next_index = iter(range(num_prompts))

        async def worker():
            for i in next_index:
                body = _payload(
                    api, model, prompts[i % len(prompts)], max_tokens, temperature, extra_body or {}
                )
                results.append(await _one_request(client, url, body, i))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, num_prompts))))
        duration = time.perf_counter() - t0
        after = await _fetch_metrics(client, root)
    summary = summarize(sorted(results, key=lambda r: r.index), duration)
    summary["spec_decode"] = spec_decode_delta(before, after)
    summary["config"] = {
        "base_url": base_url,
        "model": model,
        "api": api,
        "concurrency": concurrency,
        "num_prompts": num_prompts,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    return summary


# ---------------------------------------------------------------- report and CLI


def format_table(s: dict) -> str:
    def row(name, value, fmt="{:.2f}"):
        shown = "n/a" if value is None else (fmt.format(value) if fmt else str(value))
        return f"{name:<42}{shown:>12}"

    lines = [
        "{:=^54}".format(" Serving Benchmark Result "),
        row("Successful requests:", s["completed"], None),
        row("Failed requests:", s["failed"], None),
        row("Benchmark duration (s):", s["duration_s"]),
        row("Total output tokens:", s["total_output_tokens"], None),
        row("Request throughput (req/s):", s["request_throughput"]),
        row("Output token throughput (tok/s):", s["output_token_throughput"]),
        row("Mean TTFT (ms):", s["mean_ttft_ms"]),
        row("Median TTFT (ms):", s["median_ttft_ms"]),
        row("Mean TPOT (ms):", s["mean_tpot_ms"]),
        row("Median TPOT (ms):", s["median_tpot_ms"]),
        "{:-^54}".format(" Speculative Decoding (pooled) "),
    ]
    sd = s.get("spec_decode")
    if sd is None:
        lines.append("no vllm:spec_decode_* counters at /metrics")
    else:
        lines += [
            row("Drafts:", sd["num_drafts"], None),
            row("Draft tokens (scheduled):", sd["num_draft_tokens"], None),
        ]
        if sd.get("num_verified_draft_tokens") is not None:
            lines.append(row("Draft tokens verified:", sd["num_verified_draft_tokens"], None))
        lines += [
            row("Accepted tokens:", sd["num_accepted_tokens"], None),
            row(
                "Acceptance rate (%):",
                None if sd["acceptance_rate"] is None else 100 * sd["acceptance_rate"],
            ),
            row("Mean acceptance length:", sd["mean_acceptance_length"]),
        ]
        for i, rate in enumerate(sd["per_position_acceptance_rates"]):
            lines.append(row(f"Acceptance rate, position {i}:", rate, "{:.3f}"))
    pr = s.get("per_request_acceptance")
    if pr:  # the server's own per-request figures, pooled, with the interval over requests
        lo, hi = pr["ci95"]
        lines.append(row("Mean acceptance length, by request:", pr["mean_acceptance_length"]))
        label, interval = f"  95% interval ({pr['requests']} requests):", f"{lo:.2f}-{hi:.2f}"
        lines.append(f"{label:<42}{interval:>12}")
    if s.get("output_tokens_from_usage") is False:
        lines.append("note: the server sent no usage; output tokens were counted by chunks")
    for err in s.get("errors") or []:
        lines.append(f"error: {err}")
    lines.append("=" * 54)
    return "\n".join(lines)


def load_prompts(path: str | None) -> list[str]:
    """Built-in prompts, or a file: .jsonl ({"prompt": ...} or strings), .json (a list), or text
    (one prompt per non-empty line)."""
    if path is None:
        return list(DEFAULT_PROMPTS)
    p = Path(path)
    text = p.read_text()
    if p.suffix == ".jsonl":
        items = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    elif p.suffix == ".json":
        items = json.loads(text)
    else:
        items = [ln for ln in text.splitlines() if ln.strip()]
    prompts = [it["prompt"] if isinstance(it, dict) else str(it) for it in items]
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serve.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (or .../v1)")
    ap.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompts", default=None, help="prompt file (.jsonl, .json or text)")
    ap.add_argument("--api", choices=("completions", "chat"), default="completions")
    ap.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM extension)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    ap.add_argument("--json", dest="json_out", default=None, help="write the numbers here")
    args = ap.parse_args(argv)
    if args.concurrency < 1 or args.num_prompts < 1 or args.max_tokens < 1:
        ap.error("--concurrency, --num-prompts and --max-tokens must be >= 1")
    try:
        prompts = load_prompts(args.prompts)
    except (OSError, ValueError, KeyError) as e:
        print(f"serve.bench: error: cannot read prompts: {e}", file=sys.stderr)
        return 2
    try:
        summary = asyncio.run(
            run_benchmark(
                args.base_url,
                args.model,
                prompts,
                concurrency=args.concurrency,
                num_prompts=args.num_prompts,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                api=args.api,
                extra_body={"ignore_eos": True} if args.ignore_eos else None,
                timeout_s=args.timeout,
            )
        )
    except httpx.HTTPError as e:
        print(f"serve.bench: error: {args.base_url}: {e}", file=sys.stderr)
        return 1
    print(format_table(summary))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
