"""`python -m train.prepare.regenerate --target DIR --data FILE --out FILE`: the target answers
the prompts.

On-policy data for distillation (the paper regenerates every response with the target at T=0.7,
top-p 0.8): each conversation's final assistant turn is dropped and the target writes its own
(train/data/regenerate.py holds the contracts). The run is resumable: rerun the same command after a
kill and only missing rows are generated; `--max-seconds` ends the run by that time: a chunk of
`--batch-size` rows starts only if, at the previous chunk's pace, it ends within it (the first
always starts), so a run with a fixed time budget keeps what it wrote and a rerun goes on from
there. Beside OUT it writes OUT.summary.json (rows, tokens,
finish reasons, sampling, backend, seconds), which `train.distill` copies into the checkpoint's
provenance when OUT is its `data.train`.

Several engines on one GPU (a small target's vLLM decode is bound by the host, not the GPU): run
`--shard K/N` for K = 0..N-1, each its own process writing OUT.shardK-of-N (seeded from the rows
OUT already holds), then `--join-shards N` (no --data) puts them together as OUT.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from train.data import load_rows
from train.data.regenerate import (
    BACKENDS,
    join_shards,
    regenerate_responses,
    seed_shard,
    shard_of,
    shard_path,
    summarize_regenerated,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="HF folder of the target (its tokenizer too)")
    ap.add_argument("--data", help="chat rows (.jsonl/.json/.parquet, .jsonl.gz)")
    ap.add_argument("--out", required=True, help="regenerated rows (.jsonl), appended on resume")
    ap.add_argument("--backend", choices=BACKENDS, default="auto")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=512, help="prompts per generate call")
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="be done by then: no chunk starts that would end later",
    )
    ap.add_argument(
        "--vllm-cuda-graphs", action="store_true", help="vllm backend: CUDA graphs (default eager)"
    )
    ap.add_argument("--vllm-max-num-seqs", type=int, default=None, help="vllm backend: batch cap")
    ap.add_argument(
        "--vllm-gpu-memory",
        type=float,
        default=None,
        help="vllm backend: share of the GPU's memory (default vLLM's 0.9); lower to share the GPU",
    )
    ap.add_argument(
        "--vllm-kv-cache-gib",
        type=float,
        default=None,
        help="vllm backend: a KV cache of this size instead of one sized by a start-up memory "
        "profile, whose check fails while another engine on the GPU frees memory",
    )
    ap.add_argument("--shard", default=None, metavar="K/N", help="answer only shard K of N")
    ap.add_argument("--ready-file", default=None, help="touched once the engine is built")
    ap.add_argument(
        "--join-shards", type=int, default=None, metavar="N", help="join OUT's N shard files"
    )
    a = ap.parse_args(argv)
    if a.join_shards is not None:
        return join(a.out, a.join_shards, a.target)
    if a.data is None:
        ap.error("--data is needed (all but --join-shards)")
    shard = parse_shard(ap, a.shard)
    if a.vllm_gpu_memory is not None and not 0 < a.vllm_gpu_memory <= 1:
        ap.error(f"--vllm-gpu-memory must be in (0, 1], got {a.vllm_gpu_memory}")
    if a.vllm_kv_cache_gib is not None and not a.vllm_kv_cache_gib > 0:
        ap.error(f"--vllm-kv-cache-gib must be > 0, got {a.vllm_kv_cache_gib}")
    vllm_options = {
        "cuda_graphs": a.vllm_cuda_graphs,
        "max_num_seqs": a.vllm_max_num_seqs,
        "gpu_memory_utilization": a.vllm_gpu_memory,
    }
    if a.vllm_kv_cache_gib is not None:
        vllm_options["kv_cache_memory_bytes"] = int(a.vllm_kv_cache_gib * 2**30)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.target)
    rows = load_rows(a.data, max_rows=a.max_rows)
    sampling = {
        "temperature": a.temperature,
        "top_p": a.top_p,
        "max_new_tokens": a.max_new_tokens,
        "seed": a.seed,
    }
    if a.max_seconds is not None and a.max_seconds < 0:
        ap.error(f"--max-seconds must be >= 0, got {a.max_seconds}")
    t0 = time.perf_counter()
    deadline = None if a.max_seconds is None else time.monotonic() + a.max_seconds
    out = a.out if shard == (0, 1) else seed_shard(a.out, *shard, a.batch_size)
    written = regenerate_responses(
        rows,
        a.target,
        tokenizer,
        sampling,
        out,
        a.batch_size,
        backend=a.backend,
        on_bad_row="skip",
        vllm_options=vllm_options,
        deadline=deadline,
        shard=shard,
        on_ready=a.ready_file and (lambda: Path(a.ready_file).touch()),
    )
    summary = summarize_regenerated(out, tokenizer)
    summary.update(
        source=a.data,
        source_rows=len(rows),
        written_this_run=written,
        seconds_this_run=round(time.perf_counter() - t0, 1),
        vllm_options_this_run=vllm_options,
        max_seconds_this_run=a.max_seconds,
        source_rows_missing=own_rows(len(rows), a.batch_size, shard) - summary["rows"],
        shard=list(shard),
    )
    Path(out + ".summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


def own_rows(rows: int, batch_size: int, shard: tuple[int, int]) -> int:
    """How many of `rows` source rows fall in this shard."""
    return sum(1 for i in range(rows) if shard_of(i, batch_size, shard[1]) == shard[0])


def parse_shard(ap, text: str | None) -> tuple[int, int]:
    if text is None:
        return (0, 1)
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        ap.error(f"--shard takes K/N (e.g. 0/4), got {text!r}")
    if not 0 <= k < n:
        ap.error(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return (k, n)


def join(out: str, n: int, target: str) -> int:
    """`--join-shards N`: OUT from its shard files; OUT.summary.json from the joined rows, with
    each shard's own summary (seconds, rows written) under "shards"."""
    from transformers import AutoTokenizer

    shards = []
    for k in range(n):
        path = Path(shard_path(out, k, n) + ".summary.json")
        if path.exists():
            shards.append(json.loads(path.read_text()))
            path.unlink()
    joined = join_shards(out, n)
    base = shards[0] if shards else {}
    summary = {
        **{k: v for k, v in base.items() if k.startswith("source") or k.startswith("vllm")},
        **summarize_regenerated(out, AutoTokenizer.from_pretrained(target)),
        "engines": n,
        "written_this_run": sum(s.get("written_this_run", 0) for s in shards),
        "seconds_this_run": max((s.get("seconds_this_run", 0) for s in shards), default=0),
        "joined_from": joined["from"],
        "shards": shards,
    }
    summary["source_rows_missing"] = summary.get("source_rows", summary["rows"]) - summary["rows"]
    Path(out + ".summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "shards"}, indent=2))
    return 0


REGENERATED_NAME = "regenerated.jsonl"


def regenerate_train_rows(cfg, target_model, tokenizer, out: Path) -> None:
    """Optional step 2: the target answers the training prompts itself, into a resumable JSONL
    (OUTPUT/regenerated.jsonl, sampling parameters stored per row) that training then reads."""
    rcfg = cfg.data.regenerate
    rows = load_rows(cfg.data.train, split=cfg.data.split, max_rows=cfg.data.max_rows)
    dest = out / REGENERATED_NAME
    sampling = {
        "temperature": rcfg.temperature,
        "top_p": rcfg.top_p,
        "max_new_tokens": rcfg.max_new_tokens,
        "seed": cfg.seed,
    }
    # vLLM loads the target itself from its path; HF reuses the already loaded model.
    model = cfg.target.path if rcfg.backend == "vllm" else target_model
    n = regenerate_responses(
        rows,
        model,
        tokenizer,
        sampling,
        dest,
        rcfg.batch_size,
        backend=rcfg.backend,
        on_bad_row=cfg.data.on_bad_row,
    )
    summary = {**summarize_regenerated(dest, tokenizer), "source": cfg.data.train}
    Path(f"{dest}.summary.json").write_text(json.dumps(summary, indent=2))
    print(f"[distill] regenerated {n} responses into {dest}")


if __name__ == "__main__":
    sys.exit(main())
