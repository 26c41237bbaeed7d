"""Serve-time acceptance gate: our checkpoint through real vLLM vs our embedded engine (H200).

    python3 scripts/gpu/vllm_vs_engine.py --target artifacts/small-target \
        --draft outputs/small_gpu/final --num-prompts 32 --max-tokens 96 --json $OUT/gate.json

Steps, on the same held-out prompts (TARGET/data/heldout.jsonl user turns, chat template):
1. HF greedy reference: the target's own `generate` (greedy).
2. vLLM: `vllm.LLM(target, speculative_config={"method": "dspark", "model": DRAFT,
   "num_speculative_tokens": N})`, greedy then T=1, counters from `llm.get_metrics()` (deltas):
   mean acceptance length and per-position rates (accepted at k / drafts).
3. Our engine (`serve.engine`), same prompts, greedy then T=1, same counters.
Checks (exit 1 if any fails): vLLM greedy == HF greedy == engine greedy, token for token;
per-position rates of vLLM and engine within --tol (absolute) at both temperatures. A random
draft gets ~0 in vLLM (seen); a trained one must land near our engine's figures.

vLLM 0.26 (the H200 image's torch) reads the layout from `dspark_bonus_anchor`; our config writes
both layout keys. `--strip-embed` serves a copy without `embed_tokens` (vLLM then shares the
target's), in case that vLLM version refuses a draft-owned embedding.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.eval_acceptance import evaluate, heldout_prompts  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
DTYPE = "bfloat16"  # --dtype; greedy equality across three implementations needs one dtype


def prompts_of(target: str, n: int) -> list[list[int]]:
    """`n` held-out prompts, domains interleaved (scripts/eval_acceptance.py renders them)."""
    from transformers import AutoTokenizer

    by_domain = heldout_prompts(target, AutoTokenizer.from_pretrained(target), n)
    mixed = [p for group in zip(*by_domain.values(), strict=False) for p in group]
    return mixed[:n]


def hf_greedy(target: str, prompts, max_tokens: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, DTYPE)).cuda().eval()
    outs = []
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        g = m.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        outs.append(g[0, len(p) :].tolist())
    del m
    torch.cuda.empty_cache()
    return outs


def spec_counters(metrics) -> dict:
    c = {"drafts": 0, "accepted": 0, "per_pos": []}
    for m in metrics:
        if m.name == "vllm:spec_decode_num_drafts":
            c["drafts"] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            c["accepted"] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            c["per_pos"] = list(m.values)
    return c


def delta(a: dict, b: dict) -> dict:
    d = b["drafts"] - a["drafts"]
    pp = [y - (a["per_pos"][i] if i < len(a["per_pos"]) else 0) for i, y in enumerate(b["per_pos"])]
    return {
        "drafts": d,
        "mean_acceptance_length": 1 + (b["accepted"] - a["accepted"]) / max(d, 1),
        "per_position_rate": [x / max(d, 1) for x in pp],
    }


def run_vllm(target, draft, n_spec, prompts, max_tokens) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=target,
        dtype=DTYPE,
        max_model_len=2048,
        gpu_memory_utilization=0.4,
        max_num_seqs=16,
        disable_log_stats=False,
        speculative_config={"method": "dspark", "model": draft, "num_speculative_tokens": n_spec},
    )
    res, inputs = {}, [{"prompt_token_ids": p} for p in prompts]
    for t in (0.0, 1.0):
        before = spec_counters(llm.get_metrics())
        outs = llm.generate(
            inputs, SamplingParams(max_tokens=max_tokens, temperature=t, seed=0, ignore_eos=False)
        )
        res[str(t)] = {
            **delta(before, spec_counters(llm.get_metrics())),
            "outputs": [list(o.outputs[0].token_ids) for o in outs],
        }
    return res


def run_engine(target, draft, prompts, max_tokens) -> dict:
    from serve.engine import Engine, EngineOptions

    opts = EngineOptions(
        target=target,
        checkpoint=draft,
        device="cuda",
        dtype=DTYPE,
        max_num_seqs=16,
        max_model_len=2048,
    )
    eng = Engine.from_options(opts)
    return {str(t): evaluate(eng, prompts, t, max_tokens, seed=0) for t in (0.0, 1.0)}


def strip_embed(draft: str) -> str:
    from safetensors.torch import load_file, save_file

    dst = Path(draft).with_name(Path(draft).name + "-noembed")
    shutil.copytree(draft, dst, dirs_exist_ok=True)
    t = load_file(str(dst / "model.safetensors"))
    t.pop("embed_tokens.weight", None)
    save_file(t, str(dst / "model.safetensors"))
    return str(dst)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--strip-embed", action="store_true")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    global DTYPE
    DTYPE = a.dtype
    from common.checkpoint import read_config

    n_spec = read_config(a.draft).num_speculative_tokens
    prompts = prompts_of(a.target, a.num_prompts)
    served = strip_embed(a.draft) if a.strip_embed else a.draft
    import vllm

    report = {
        "vllm_version": vllm.__version__,
        "served_draft": served,
        "stripped": ["embed_tokens.weight"] if a.strip_embed else [],
        "hf_greedy": hf_greedy(a.target, prompts, a.max_tokens),
    }
    report["engine"] = run_engine(a.target, a.draft, prompts, a.max_tokens)
    report["vllm"] = run_vllm(a.target, served, n_spec, prompts, a.max_tokens)
    checks = {
        "vllm_greedy_equals_hf": report["vllm"]["0.0"]["outputs"] == report["hf_greedy"],
        "engine_greedy_equals_hf": report["engine"]["0.0"]["outputs"] == report["hf_greedy"],
    }
    for t in ("0.0", "1.0"):
        v, e = report["vllm"][t]["per_position_rate"], report["engine"][t]["per_position_rate"]
        checks[f"per_pos_within_tol_T{t}"] = len(v) == len(e) and all(
            abs(x - y) <= a.tol for x, y in zip(v, e, strict=True)
        )
        print(
            f"T={t} vLLM tau={report['vllm'][t]['mean_acceptance_length']:.3f} "
            f"engine tau={report['engine'][t]['mean_acceptance_length']:.3f}"
        )
        print("  vLLM  ", " ".join(f"{x:.3f}" for x in v))
        print("  engine", " ".join(f"{x:.3f}" for x in e))
    report["checks"] = checks
    print(json.dumps(checks, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(report))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
