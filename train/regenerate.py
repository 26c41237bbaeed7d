"""`python -m train.regenerate --target DIR --data FILE --out FILE`: the target answers the prompts.

On-policy data for distillation (the paper regenerates every response with the target at T=0.7,
top-p 0.8): each conversation's final assistant turn is dropped and the target writes its own
(train/data/regenerate.py holds the contracts). The run is resumable: rerun the same command after a
kill and only missing rows are generated; `--max-seconds` ends the run by that time: a chunk of
`--batch-size` rows starts only if, at the previous chunk's pace, it ends within it (the first
always starts), so a run with a fixed time budget keeps what it wrote and a rerun goes on from
there. Beside OUT it writes OUT.summary.json (rows, tokens,
finish reasons, sampling, backend, seconds), which `train.distill` copies into the checkpoint's
provenance when OUT is its `data.train`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from train.data import load_rows
from train.data.regenerate import BACKENDS, regenerate_responses, summarize_regenerated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="HF folder of the target (its tokenizer too)")
    ap.add_argument("--data", required=True, help="chat rows (.jsonl/.json/.parquet, .jsonl.gz)")
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
    a = ap.parse_args(argv)
    if a.vllm_gpu_memory is not None and not 0 < a.vllm_gpu_memory <= 1:
        ap.error(f"--vllm-gpu-memory must be in (0, 1], got {a.vllm_gpu_memory}")
    vllm_options = {
        "cuda_graphs": a.vllm_cuda_graphs,
        "max_num_seqs": a.vllm_max_num_seqs,
        "gpu_memory_utilization": a.vllm_gpu_memory,
    }
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
    written = regenerate_responses(
        rows,
        a.target,
        tokenizer,
        sampling,
        a.out,
        a.batch_size,
        backend=a.backend,
        on_bad_row="skip",
        vllm_options=vllm_options,
        deadline=deadline,
    )
    summary = summarize_regenerated(a.out, tokenizer)
    summary.update(
        source=a.data,
        source_rows=len(rows),
        written_this_run=written,
        seconds_this_run=round(time.perf_counter() - t0, 1),
        vllm_options_this_run=vllm_options,
        max_seconds_this_run=a.max_seconds,
        source_rows_missing=len(rows) - summary["rows"],
    )
    Path(a.out + ".summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
