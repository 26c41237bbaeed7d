"""Load test of the embedded OpenAI server (127.0.0.1 only): many streaming clients, some that
hang up mid-stream, some that send malformed bodies.

    python scripts/load_test_server.py                          # fixtures target, 64 clients, 120 s
    python scripts/load_test_server.py --clients 16 --duration 60
    python scripts/load_test_server.py --target artifacts/tiny-target \
        --checkpoint outputs/tiny/final --dtype float32

Checks (exit 1 if any fails):
- every completed greedy answer equals the target's own greedy output (HF `generate`, same dtype);
- no error other than the expected 400s (malformed bodies) and 429s (queue full, answered at once);
- the KV cache is empty once idle: `dspark:kv_slots_used`, `dspark:engine_requests` and the
  running/waiting gauges are 0 on /metrics;
- resident memory of the server is flat: the RSS at the end exceeds the RSS after warm-up (the
  first 20% of the run) by at most max(16 MiB, 5%).
Prints p50/p99 latency of completed requests, time to first token, and throughput.

Default assets: the test fixtures' predictable float64 target (tests/unit/test_engine_helpers.py)
with a
weakly tuned draft, written to a temp folder; `--target/--checkpoint` serve real folders instead.
Requests use `ignore_eos` so every answer has exactly `--max-tokens` tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

MALFORMED = [
    b"{not json",
    json.dumps({"prompt": [5, 6], "max_tokens": "lots"}).encode(),
    json.dumps({"prompt": [5, 6], "max_tokens": 4, "temperature": -1}).encode(),
    json.dumps({"max_tokens": 4}).encode(),
]


@dataclass
class Tally:
    completed: int = 0
    mismatched: int = 0
    disconnected: int = 0
    malformed_ok: int = 0  # malformed bodies answered 400
    rejected_429: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0


def fixture_assets(root: Path) -> tuple[Path, Path]:
    from tests.unit.test_engine_helpers import make_draft, make_target, save_draft, save_target

    target = make_target(0, predictable=True)
    draft = make_draft(target, True, None, tuned=True, strength=0.2)
    return save_target(target, root / "target"), save_draft(draft, root / "draft")


def greedy_references(target_dir: Path, prompts, max_tokens: int, dtype) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype).eval()
    refs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            refs.append(out[0, len(p) :].tolist())
    return refs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(a, target: Path, ckpt: Path | None, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "serve.api", "--target", str(target), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--dtype", a.dtype, "--max-num-seqs", str(a.max_num_seqs)]
    cmd += ["--max-queued", str(a.max_queued), "--max-model-len", str(a.max_model_len)]
    cmd += ["--draft-sampling", "greedy"]
    if ckpt is not None:
        cmd += ["--checkpoint", str(ckpt)]
    print("server:", " ".join(cmd), f"(log: {log})")
    env = {**os.environ, "OMP_NUM_THREADS": str(a.server_threads)}
    repo = Path(__file__).resolve().parents[1]
    return subprocess.Popen(cmd, cwd=repo, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server not healthy after {timeout}s")


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.proc, self.every_s = psutil.Process(pid), every_s
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), self.proc.memory_info().rss))
            self.stop.wait(self.every_s)


async def one_client(i, a, url, prompts, refs, deadline, tally: Tally, rng: random.Random):
    async with httpx.AsyncClient(base_url=url, timeout=a.request_timeout) as client:
        while time.monotonic() < deadline:
            roll = rng.random()
            if roll < a.malformed:
                body = rng.choice(MALFORMED)
                r = await client.post(
                    "/v1/completions", content=body, headers={"content-type": "application/json"}
                )
                if r.status_code == 400 and "error" in r.json():
                    tally.malformed_ok += 1
                else:
                    tally.errors.append(f"malformed body answered {r.status_code}: {r.text[:200]}")
                continue
            k = rng.randrange(len(prompts))
            hang_up = roll < a.malformed + a.disconnect
            body = {
                "prompt": prompts[k],
                "max_tokens": a.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "return_token_ids": True,
            }
            t0 = time.monotonic()
            ids, first, chunks = [], None, 0
            try:
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    if r.status_code == 429:
                        msg = json.loads(await r.aread())["error"]["message"]
                        if "capacity" not in msg:
                            tally.errors.append(f"429 without a clear message: {msg}")
                        tally.rejected_429 += 1
                        await asyncio.sleep(0.05 * rng.random())
                        continue
                    if r.status_code != 200:
                        tally.errors.append(f"status {r.status_code}: {(await r.aread())[:200]}")
                        continue
                    stop_after = rng.randint(1, 3) if hang_up else None
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            tally.errors.append(f"in-band error: {chunk['error']}")
                            break
                        first = first or time.monotonic()
                        ids += chunk["choices"][0].get("token_ids") or []
                        chunks += 1
                        if stop_after is not None and chunks >= stop_after:
                            break  # leaving the context closes the connection mid-stream
            except httpx.HTTPError as e:
                tally.errors.append(f"client {i}: {type(e).__name__}: {e}")
                continue
            if hang_up:
                tally.disconnected += 1
                continue
            tally.completed += 1
            tally.tokens += len(ids)
            tally.latencies.append(time.monotonic() - t0)
            if first is not None:
                tally.ttfts.append(first - t0)
            if ids != refs[k]:
                tally.mismatched += 1
                if tally.mismatched <= 3:
                    tally.errors.append(f"prompt {k}: got {ids}, target greedy {refs[k]}")


def scrape(url: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--target", type=Path, default=None, help="HF target folder (default: fixtures)"
    )
    ap.add_argument("--checkpoint", type=Path, default=None, help="draft folder (with --target)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    ap.add_argument("--disconnect", type=float, default=0.2, help="share hanging up mid-stream")
    ap.add_argument("--malformed", type=float, default=0.05, help="share of malformed bodies")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-queued", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="dspark-load-"))
    if a.target is None:
        target, ckpt = fixture_assets(work)
        print(f"assets: test fixtures (predictable float64 target + tuned draft) in {work}")
    else:
        target, ckpt = a.target, a.checkpoint
    rng = random.Random(a.seed)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    prompts = [
        [rng.randrange(7, vocab) for _ in range(rng.randint(3, 12))] for _ in range(a.num_prompts)
    ]
    dtype = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
    refs = greedy_references(target, prompts, a.max_tokens, dtype[a.dtype])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(a, target, ckpt, port, work / "server.log")
    try:
        wait_healthy(url, proc)
        rss = RssSampler(proc.pid)
        rss.start()
        tally = Tally()
        t_start = time.monotonic()
        deadline = t_start + a.duration

        async def run_all():
            await asyncio.gather(
                *(
                    one_client(i, a, url, prompts, refs, deadline, tally, random.Random(a.seed + i))
                    for i in range(a.clients)
                )
            )

        asyncio.run(run_all())
        wall = time.monotonic() - t_start
        time.sleep(2.0)  # idle: every aborted request must have released its slot by now
        m = scrape(url)
        rss.stop.set()
        rss.join()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    samples = rss.samples
    warm_t = samples[0][0] + 0.2 * (samples[-1][0] - samples[0][0])
    warm = next(r for t, r in samples if t >= warm_t)
    end, peak = samples[-1][1], max(r for _, r in samples)
    mib = 1 << 20
    growth = end - warm
    leaks = {
        k: m.get(k, float("nan"))
        for k in (
            "dspark:kv_slots_used",
            "dspark:engine_requests",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
        )
    }
    figures = {
        "clients": a.clients,
        "duration_s": round(wall, 1),
        "completed": tally.completed,
        "disconnected_mid_stream": tally.disconnected,
        "malformed_answered_400": tally.malformed_ok,
        "rejected_429": tally.rejected_429,
        "mismatched": tally.mismatched,
        "errors": len(tally.errors),
        "latency_p50_s": round(pct(tally.latencies, 0.5), 3),
        "latency_p99_s": round(pct(tally.latencies, 0.99), 3),
        "ttft_p50_s": round(pct(tally.ttfts, 0.5), 3),
        "ttft_p99_s": round(pct(tally.ttfts, 0.99), 3),
        "throughput_req_s": round(tally.completed / wall, 2),
        "throughput_tok_s": round(tally.tokens / wall, 1),
        "mean_acceptance_length": round(
            1
            + m.get("vllm:spec_decode_num_accepted_tokens_total", 0)
            / max(m.get("vllm:spec_decode_num_drafts_total", 0), 1),
            3,
        ),
        "idle_gauges": leaks,
        "rss_warm_mib": round(warm / mib, 1),
        "rss_end_mib": round(end / mib, 1),
        "rss_peak_mib": round(peak / mib, 1),
        "rss_growth_mib": round(growth / mib, 1),
        "rss_samples": len(samples),
    }
    checks = {
        "greedy answers equal the target's": tally.mismatched == 0 and tally.completed > 0,
        "no unexpected errors": not tally.errors,
        "KV cache empty when idle": all(v == 0 for v in leaks.values()),
        "resident memory flat": growth <= max(16 * mib, 0.05 * warm),
    }
    print(json.dumps(figures, indent=2))
    for e in tally.errors[:10]:
        print("error:", e)
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    if a.json:
        a.json.write_text(json.dumps({"figures": figures, "checks": checks}, indent=2) + "\n")
    if tally.latencies:
        print(
            f"latency p50 {statistics.median(tally.latencies):.3f}s p99 "
            f"{pct(tally.latencies, 0.99):.3f}s; {figures['throughput_req_s']} req/s, "
            f"{figures['throughput_tok_s']} tok/s"
        )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
