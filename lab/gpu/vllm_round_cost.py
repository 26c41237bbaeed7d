"""The cost of a DSpark round in vLLM 0.26 at a real target's shape, dummy weights (GPU).

    PYTHONPATH=/tmp/vsite:$PYTHONPATH python3 lab/gpu/vllm_round_cost.py --out $OUT/vllm_round
    python3 lab/gpu/vllm_round_cost.py --shape tiny --build-only --out /tmp/x   # CPU: dirs only

What it builds (under --work): a target folder with only a Qwen3 `config.json` of the shape
(scripts/bench_train_scale.SHAPES; vLLM runs it with `load_format="dummy"`, no tokenizer:
`skip_tokenizer_init=True` and prompt token ids), and draft checkpoints written by our exporter
(`common.checkpoint.save_checkpoint`, random weights; with `load_format="dummy"` vLLM initialises
the draft's weights too, so its config.json sets what runs): the paper's draft (5 layers, Markov
rank 256, confidence head) with the full and a 32k vocabulary (synthetic d2t), block 7. For K < 7
speculative tokens the draft is the same weights with block_size = K (vLLM needs
num_speculative_tokens >= the block; K = 1 is block 2 in the 1+N layout, as our config needs a
block >= 2), its config.json written by `DSparkConfig.to_hf_dict`.

What it measures, one vLLM engine per configuration, each in its own child process (a fresh GPU
state; results are written after every child, so a time limit still leaves the finished ones):
- per batch (1, 8, 32, 128): B random prompts of --prompt-len tokens, --decode-tokens greedy
  tokens each (ignore_eos). The engine is driven step by step (`llm.llm_engine.step()`, synchronous
  scheduling) and each step is timed; decode steps are those after every request has its first
  token and before any finishes, so prefill is excluded. t_step (target only) and t_round
  (DSpark) are their medians; tokens per round per request are reported too (random weights
  accept little; the cost does not depend on it).
- in the target-only engine: the time of one forward over m tokens (a single m-token prompt's
  prefill step, m = 1..2048): the verify-cost table (SPS) the adaptive scheduler uses.
- `profile`: one more engine, eager, 32k vocabulary, K = 7, where CUDA events around vLLM's own
  pieces split a round: target forward (verify, with the aux hidden-state capture), target logits,
  rejection sampler, the draft's backbone pass and its Markov loop (the rest of `propose` is
  input preparation); and a torch.profiler kernel table of a few rounds at batch 128.
By default: target only; DSpark K = 7 with the 32k and the full vocabulary; the profile; K = 5,
3, 1 with 32k. `--configs NAME ...` runs a subset; finished configurations in --out (part_*.json)
are kept, merged and not rerun (unless --redo), so a later call adds what a time limit cut.
Output: results.json (everything), sps_table.json (common/sampling/adaptive.py's format), the
profile table, speedup.png (if matplotlib is there). Printed: t_step, t_round, t_round / t_step
and the speed-up `tau * t_step / t_round` for tau = 1..K+1, per batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Set in main(), not at import: importing this module (the tests do) must not change the process.
RUN_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}

DRAFT = dict(num_hidden_layers=5, markov_rank=256, enable_confidence_head=True)
# The 1.5B recipe's draft has 3 layers (the paper's 8B draft 5).
DRAFT_LAYERS = {"qwen25_coder_1p5b": 3}
MASK_TOKEN = {"qwen3_8b": 151_669, "qwen25_coder_1p5b": 151_646, "tiny": 511}
LAYER_IDS = {"qwen3_8b": [1, 9, 17, 25, 33], "qwen25_coder_1p5b": None, "tiny": None}
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SPS_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


# ---------------------------------------------------------------------------- folders
def config_names(ks, vocabs) -> list[str]:
    """Priority order: what the summary needs first (a time limit cuts the tail)."""
    names = ["target"]
    for v in vocabs:
        if 7 in ks:
            names.append(f"dspark_{v}_k7")
    if "v32k" in vocabs:
        names.append("profile")
    sweep = "v32k" if "v32k" in vocabs else vocabs[0]  # K < 7 for one vocabulary
    names += [f"dspark_{sweep}_k{k}" for k in sorted(ks, reverse=True) if k != 7]
    return names


def parse_config(name: str) -> tuple[str, int]:
    """'dspark_v32k_k5' -> ('v32k', 5); 'profile' -> ('v32k', 7)."""
    if name == "profile":
        return "v32k", 7
    _, vocab, k = name.split("_")
    return vocab, int(k[1:])


def build_target_dir(shape: str, work: Path) -> Path:
    from transformers import Qwen2Config, Qwen3Config

    from scripts.bench_train_scale import SHAPES

    out = work / f"target-{shape}"
    if (out / "config.json").exists():
        return out
    spec = SHAPES[shape]
    if spec["family"] not in ARCHITECTURES:
        raise SystemExit(f"--shape {shape}: this script builds Qwen2 and Qwen3 targets only")
    cls = Qwen3Config if spec["family"] == "qwen3" else Qwen2Config
    arch = [ARCHITECTURES[spec["family"]]]
    cfg = cls(**spec["target"], architectures=arch, dtype="bfloat16")
    cfg.save_pretrained(out)
    return out


def draft_config(shape: str, target_dir: Path, vocab: str, block: int):
    from common.config import DSparkConfig

    hf = json.loads((target_dir / "config.json").read_text())
    full = vocab == "vfull"
    dvocab = None if full else min(32_768, hf["vocab_size"] // 2)
    return DSparkConfig.from_target(
        hf,
        mask_token_id=MASK_TOKEN[shape],
        block_size=block,
        draft_vocab_size=dvocab,
        target_layer_ids=LAYER_IDS[shape],
        **{**DRAFT, "num_hidden_layers": DRAFT_LAYERS.get(shape, DRAFT["num_hidden_layers"])},
    )


def build_draft_dirs(shape: str, target_dir: Path, work: Path, ks, vocabs) -> dict[str, Path]:
    """{config name: draft dir}. One exported checkpoint per vocabulary (block 7); the K < 7
    folders share its weights file and get their own config.json."""
    import torch

    from common.checkpoint import save_checkpoint
    from common.config import DSparkConfig
    from common.model import DSparkDraftModel
    from scripts.bench_train_scale import synthetic_vocab_map
    from train.loop.objective import init_draft_weights

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dirs = {}
    for vocab in vocabs:
        base = work / f"draft-{shape}-{vocab}-k7"
        cfg = draft_config(shape, target_dir, vocab, 7)
        if not (base / "model.safetensors").exists():
            with torch.device(dev):
                model = DSparkDraftModel(cfg)
            init_draft_weights(model)
            g = torch.Generator(device=dev).manual_seed(0)
            emb = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g, device=dev) * 0.02
            maps = ()
            if cfg.reduced_vocab:
                vm = synthetic_vocab_map(cfg.vocab_size, cfg.draft_vocab_size)
                maps = (vm.d2t.to(dev), vm.t2d.to(dev))
            model.init_from_target(emb, emb, *maps)
            save_checkpoint(model, base, include_embed=False, provenance={"weights": "random"})
            del model
            if dev == "cuda":  # the vLLM children need the memory
                torch.cuda.empty_cache()
        for k in ks:
            name = f"dspark_{vocab}_k{k}"
            if k == 7:
                dirs[name] = base
                continue
            d = work / f"draft-{shape}-{vocab}-k{k}"
            d.mkdir(parents=True, exist_ok=True)
            hf = json.loads((base / "config.json").read_text())
            # K >= 2: block K, anchor-first (K drafts); K = 1: block 2 in the 1+N layout (our
            # config needs block >= 2; vLLM 0.26 reads the layout from dspark_bonus_anchor).
            layout = dict(block_size=k) if k >= 2 else dict(block_size=2, sample_from_anchor=False)
            kcfg = dataclasses.replace(DSparkConfig.from_hf_dict(hf), **layout)
            assert kcfg.num_speculative_tokens == k
            (d / "config.json").write_text(json.dumps(kcfg.to_hf_dict(), indent=2, sort_keys=True))
            link = d / "model.safetensors"
            if not link.exists():
                link.symlink_to(base / "model.safetensors")
            dirs[name] = d
        if vocab == "v32k":
            dirs["profile"] = base
    return dirs


# ---------------------------------------------------------------------------- the engine
def make_llm(target_dir: Path, draft_dir: Path | None, k: int, args, eager: bool):
    from vllm import LLM

    batches = sorted(args.batches)
    spec = None
    if draft_dir is not None:
        spec = {
            "method": "dspark",
            "model": str(draft_dir),
            "num_speculative_tokens": k,
            "draft_sample_method": "greedy",
        }
    kwargs = dict(
        model=str(target_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=max(args.prompt_len + args.decode_tokens + 64, max(SPS_SIZES) + 16),
        max_num_seqs=max(batches),
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=False,
        enforce_eager=eager,
        disable_log_stats=False,
        async_scheduling=False,
        seed=0,
        speculative_config=spec,
    )
    if not eager and args.capture == "requests":  # vLLM >= 0.34's own keys: decode graphs by
        # request count, for the target's verify (q = K + 1) and the draft's query alike
        kwargs["compilation_config"] = {"decode_cudagraph_capture_request_sizes": batches}
    elif not eager:  # capture only the decode sizes used (graph capture is start-up time); the
        # same list for every configuration, so vLLM's compile cache serves the target each time
        sizes = sorted({b * (n + 1) for b in batches for n in (0, *args.ks)})
        kwargs["compilation_config"] = {
            "cudagraph_capture_sizes": sizes,
            "max_cudagraph_capture_size": max(sizes),
        }
    return LLM(**kwargs)


def run_steps(llm, prompts: list[list[int]], max_tokens: int):
    """Add the prompts, step the engine to completion -> [(seconds, {req: (tokens, finished)})]."""
    from vllm import SamplingParams

    eng = llm.llm_engine
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False
    )
    stamp = time.monotonic_ns()
    for i, p in enumerate(prompts):
        eng.add_request(f"r{stamp}-{i}", {"prompt_token_ids": p}, params)
    steps = []
    while eng.has_unfinished_requests():
        t0 = time.perf_counter()
        outs = eng.step()
        dt = time.perf_counter() - t0
        state = {o.request_id: (len(o.outputs[0].token_ids), o.finished) for o in outs}
        steps.append((dt, state))
    return steps


def decode_window(steps, n_req: int, with_index: bool = False):
    """(durations, tokens per request[, step indices]) of the steps after every request has
    >= 1 token and up to (excluding) the first step where a request finishes."""
    tokens: dict[str, int] = {}
    durs, per_req, index = [], [], []
    for i, (dt, state) in enumerate(steps):
        ready = len(tokens) == n_req and all(v >= 1 for v in tokens.values())
        if ready and any(fin for _, fin in state.values()):
            break
        if ready and state:
            new = sum(n - tokens.get(r, 0) for r, (n, _) in state.items())
            durs.append(dt)
            per_req.append(new / n_req)
            index.append(i)
        for r, (n, _) in state.items():
            tokens[r] = n
    return (durs, per_req, index) if with_index else (durs, per_req)


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 300) for _ in range(length)] for _ in range(n)]


def measure_decode(llm, args, vocab: int) -> dict:
    if args.dispatch_log:
        print(f"  dispatch log on: {llm.collective_rpc(_install_dispatch_log)[0]}", flush=True)
    run_steps(llm, random_prompts(2, 16, vocab, 99), 8)  # warm-up
    out = {}
    for b in args.batches:
        if args.dispatch_log:
            llm.collective_rpc(_collect_dispatch_log)
        steps = run_steps(llm, random_prompts(b, args.prompt_len, vocab, b), args.decode_tokens)
        if args.dispatch_log:
            out[f"dispatch_{b}"] = llm.collective_rpc(_collect_dispatch_log)[0]
        durs, per_req = decode_window(steps, b)
        if not durs:
            out[str(b)] = {"error": "no decode steps in the window"}
            continue
        out[str(b)] = {
            "median_ms": 1e3 * statistics.median(durs),
            "mean_ms": 1e3 * statistics.fmean(durs),
            "steps": len(durs),
            "tokens_per_step_per_request": statistics.fmean(per_req),
        }
        print(f"  batch {b}: {json.dumps(out[str(b)])}", flush=True)
    return out


def measure_sps(llm, vocab: int, sizes=SPS_SIZES, repeats: int = 3) -> dict:
    """Seconds of the step that prefills one m-token prompt (a forward over m tokens)."""
    ms = {}
    for m in sizes:
        times = []
        for r in range(repeats):
            steps = run_steps(llm, random_prompts(1, m, vocab, 1000 * m + r), 1)
            times.append(steps[0][0])
        ms[str(m)] = 1e3 * statistics.median(times)
    return ms


# ---------------------------------------------------------------------------- dispatch log
def _install_dispatch_log(worker) -> list[str]:
    """In the worker: record what each CUDA-graph manager's `dispatch` returns (the target's
    verify and, vLLM >= 0.34, the draft's query) as `manager mode tokens reqs` -> count, to see
    whether a decode step replays a FULL graph, a PIECEWISE one or runs eagerly."""
    runner = worker.model_runner
    log = runner._dispatch_log = {}
    done = []
    managers = (
        ("target", runner, "cudagraph_manager"),
        ("draft", getattr(runner, "speculator", None), "query_cudagraph_manager"),
        ("draft_legacy", getattr(runner, "speculator", None), "cudagraph_manager"),
    )
    for name, owner, attr in managers:
        mgr = getattr(owner, attr, None) if owner is not None else None
        if mgr is None or not hasattr(mgr, "dispatch"):
            continue

        def wrapped(*a, _fn=mgr.dispatch, _name=name, **k):
            desc = _fn(*a, **k)
            mode = getattr(desc, "cg_mode", desc)
            key = " ".join(
                (
                    _name,
                    str(getattr(mode, "name", mode)),
                    str(getattr(desc, "num_tokens", "?")),
                    str(getattr(desc, "num_reqs", "?")),
                )
            )
            log[key] = log.get(key, 0) + 1
            return desc

        mgr.dispatch = wrapped
        done.append(f"{name}: {type(mgr).__name__}")
    return done


def _collect_dispatch_log(worker) -> dict[str, int]:
    """In the worker: the dispatch counts since the last collection."""
    log = worker.model_runner._dispatch_log
    out = dict(log)
    log.clear()
    return out


# ---------------------------------------------------------------------------- profile
def _install_timers(worker) -> list[str]:
    """In the worker (through `collective_rpc`): CUDA events around vLLM's own round pieces,
    kept on the model runner (eager only: a CUDA-graph replay would not call them)."""
    import torch

    runner = worker.model_runner
    spec = runner.speculator
    events = runner._round_cost_events = {}

    def timed(name, fn):
        def call(*a, **k):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = fn(*a, **k)
            e.record()
            events.setdefault(name, []).append((s, e))
            return out

        return call

    class TimedCall:
        def __init__(self, name, obj):
            self._name, self._obj = name, obj
            self._call = timed(name, obj.__call__)

        def __call__(self, *a, **k):
            return self._call(*a, **k)

        def __getattr__(self, item):
            return getattr(self._obj, item)

    done = []
    for name, obj, attr in (
        ("target_forward", runner.model, "forward"),
        ("target_logits", runner.model, "compute_logits"),
        ("draft_propose_total", spec, "propose"),
        ("draft_backbone", spec, "_run_model"),
        ("markov_loop", spec, "_sample_sequential"),
    ):
        if hasattr(obj, attr):
            setattr(obj, attr, timed(name, getattr(obj, attr)))
            done.append(name)
    if getattr(runner, "rejection_sampler", None) is not None:
        runner.rejection_sampler = TimedCall("rejection_sampler", runner.rejection_sampler)
        done.append("rejection_sampler")
    return done


def _collect_timers(worker) -> dict[str, list[float]]:
    """In the worker: {piece: [GPU ms per call]} since the last collection."""
    import torch

    torch.cuda.synchronize()
    events = worker.model_runner._round_cost_events
    out = {k: [s.elapsed_time(e) for s, e in v] for k, v in events.items()}
    events.clear()
    return out


def measure_profile(llm, args, vocab: int, out_dir: Path) -> dict:
    import torch

    hooked = llm.collective_rpc(_install_timers)[0]
    run_steps(llm, random_prompts(2, 16, vocab, 99), 8)
    llm.collective_rpc(_collect_timers)
    res = {"hooked": hooked, "per_batch": {}}
    for b in args.profile_batches:
        steps = run_steps(llm, random_prompts(b, args.prompt_len, vocab, 7 + b), 24)
        ev = llm.collective_rpc(_collect_timers)[0]
        durs, _, window = decode_window(steps, b, with_index=True)
        # GPU ms per round of each piece: median over the decode-window rounds. Calls are matched
        # to steps from the end (every step after the first draft calls every piece once).
        pieces = {}
        for k, v in ev.items():
            sel = [v[len(v) - (len(steps) - i)] for i in window if len(v) - (len(steps) - i) >= 0]
            if sel:
                pieces[k] = statistics.median(sel)
        res["per_batch"][str(b)] = {
            "round_ms_median": 1e3 * statistics.median(durs) if durs else None,
            "pieces_ms": pieces,
        }
        print(f"  profile batch {b}: {json.dumps(res['per_batch'][str(b)])}", flush=True)
    b = max(args.profile_batches)
    prompts = random_prompts(b, args.prompt_len, vocab, 4242)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_steps(llm, prompts, 6)
    table = None
    for key in ("device_time_total", "cuda_time_total", "cpu_time_total"):
        try:
            table = prof.key_averages().table(sort_by=key, row_limit=50)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    (out_dir / f"profile_kernels_b{b}.txt").write_text(table)
    res["kernel_table"] = f"profile_kernels_b{b}.txt"
    torch.cuda.synchronize()
    return res


# ---------------------------------------------------------------------------- child / parent
def child(args) -> int:
    """One engine configuration -> args.json."""
    import vllm

    work = Path(args.work)
    target_dir = build_target_dir(args.shape, work)
    vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    res = {"config": args.config, "vllm_version": vllm.__version__, "eager": args.eager}
    res["capture"] = args.capture
    t0 = time.perf_counter()
    if args.config == "target":
        llm = make_llm(target_dir, None, 0, args, args.eager)
        res["engine_start_s"] = time.perf_counter() - t0
        res["decode"] = measure_decode(llm, args, vocab)
        res["forward_ms_by_tokens"] = measure_sps(llm, vocab)
    else:
        vname, k = parse_config(args.config)
        draft_dir = Path(args.draft_dir)
        eager = True if args.config == "profile" else args.eager
        res.update(vocab=vname, k=k, draft_dir=str(draft_dir), eager=eager)
        llm = make_llm(target_dir, draft_dir, k, args, eager)
        res["engine_start_s"] = time.perf_counter() - t0
        if args.config == "profile":
            res["profile"] = measure_profile(llm, args, vocab, Path(args.out))
        else:
            res["decode"] = measure_decode(llm, args, vocab)
    Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


def parent(args) -> int:
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    target_dir = build_target_dir(args.shape, work)
    drafts = build_draft_dirs(args.shape, target_dir, work, args.ks, args.vocabs)
    print(f"[vllm_round_cost] folders ready in {time.perf_counter() - t0:.0f}s: {work}", flush=True)
    if args.build_only:
        return 0
    results = {"args": vars(args), "configs": {}}
    for part in sorted(out.glob("part_*.json")):  # an earlier call's configurations (--configs)
        results["configs"][part.stem[len("part_") :]] = json.loads(part.read_text())
    names = args.configs or config_names(args.ks, args.vocabs)
    for name in names:
        if name in results["configs"] and not args.redo:
            print(f"[vllm_round_cost] {name}: done in an earlier call (--redo to repeat)")
            continue
        left = args.budget_s - (time.perf_counter() - t0)
        if left < 30:
            print(f"[vllm_round_cost] {name}: skipped, {left:.0f}s of --budget-s left", flush=True)
            continue
        part = out / f"part_{name}.json"
        cmd = [sys.executable, __file__, "--child", "--config", name, "--json", str(part)]
        cmd += [a for a in sys.argv[1:] if a != "--child"]
        if name != "target":
            cmd += ["--draft-dir", str(drafts[name])]
        print(f"[vllm_round_cost] {name}", flush=True)
        t = time.perf_counter()
        try:
            rc = subprocess.run(cmd, timeout=min(args.child_timeout, left)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc == 0 and part.exists():
            results["configs"][name] = json.loads(part.read_text())
            results["configs"][name]["wall_s"] = time.perf_counter() - t
            part.write_text(json.dumps(results["configs"][name], indent=2))
        else:
            part.unlink(missing_ok=True)
            results["configs"][name] = {"error": f"child exit {rc}"}
        write_outputs(results, out)
    print_tables(results)
    return 0


def write_outputs(results: dict, out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = sps_table(results)
    if table is not None:
        table.save(out / "sps_table.json")
    rows = speedup_rows(results)
    if rows:
        try:
            plot_speedup(rows, out / "speedup.png")
        except ImportError:
            pass


def sps_table(results: dict):
    """Verify-cost table: steps/s of a target forward over m tokens, from the target engine."""
    from common.sampling.adaptive import SPSTable

    t = results["configs"].get("target", {})
    ms = t.get("forward_ms_by_tokens")
    if not ms:
        return None
    sizes = sorted(int(m) for m in ms)
    meta = {
        "source": "lab/gpu/vllm_round_cost.py: one m-token prefill step, vLLM, dummy weights",
        "shape": results["args"]["shape"],
        "eager": t.get("eager"),
    }
    return SPSTable(sizes, [1e3 / ms[str(m)] for m in sizes], meta)


def speedup_rows(results: dict) -> list[dict]:
    """One row per (DSpark config, batch): t_step, t_round, ratio, speed-up per tau."""
    cfgs = results["configs"]
    step = cfgs.get("target", {}).get("decode") or {}
    rows = []
    for name, c in cfgs.items():
        if not name.startswith("dspark_") or "decode" not in c:
            continue
        for b, d in c["decode"].items():
            s = step.get(b, {})
            if "median_ms" not in d or "median_ms" not in s:
                continue
            ratio = d["median_ms"] / s["median_ms"]
            rows.append(
                {
                    "config": name,
                    "vocab": c["vocab"],
                    "k": c["k"],
                    "batch": int(b),
                    "t_step_ms": s["median_ms"],
                    "t_round_ms": d["median_ms"],
                    "round_over_step": ratio,
                    "speedup_by_tau": {
                        str(tau): tau / ratio for tau in range(1, min(7, c["k"] + 1) + 1)
                    },
                }
            )
    return sorted(rows, key=lambda r: (r["vocab"], -r["k"], r["batch"]))


def print_tables(results: dict) -> None:
    rows = speedup_rows(results)
    taus = [str(t) for t in range(1, 8)]
    print(
        "\nconfig | batch | t_step ms | t_round ms | round/step | "
        + " | ".join(f"x tau={t}" for t in taus)
    )
    print(" | ".join(["---"] * (5 + len(taus))))
    for r in rows:
        sp = [f"{r['speedup_by_tau'][t]:.2f}" if t in r["speedup_by_tau"] else "-" for t in taus]
        print(
            f"{r['config']} | {r['batch']} | {r['t_step_ms']:.2f} | {r['t_round_ms']:.2f} | "
            f"{r['round_over_step']:.2f} | " + " | ".join(sp)
        )
    prof = results["configs"].get("profile", {}).get("profile")
    if prof:
        print("\nprofile (eager, v32k, K=7): GPU ms per round")
        for b, p in prof["per_batch"].items():
            pieces = ", ".join(f"{k} {v:.2f}" for k, v in sorted(p["pieces_ms"].items()))
            print(f"  batch {b}: round {p['round_ms_median']} ms; {pieces}")
    for name, c in results["configs"].items():
        if "error" in c:
            print(f"{name}: {c['error']}")


def plot_speedup(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        if r["k"] != 7:
            continue
        taus = sorted(int(t) for t in r["speedup_by_tau"])
        style = "-" if r["vocab"] == "v32k" else "--"
        ax.plot(
            taus,
            [r["speedup_by_tau"][str(t)] for t in taus],
            style,
            marker="o",
            label=f"{r['vocab']} batch {r['batch']}",
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("acceptance length tau")
    ax.set_ylabel("speed-up tau * t_step / t_round")
    ax.set_title("DSpark K=7 in vLLM 0.26, Qwen3-8B shape, dummy weights")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    for k, v in RUN_ENV.items():  # in-process engine (timeable), no hub
        os.environ.setdefault(k, v)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3_8b", choices=sorted(MASK_TOKEN))
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-out") + "/vllm_round")
    ap.add_argument("--work", default="/tmp/vllm_round_work")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--profile-batches", type=int, nargs="+", default=[1, 128])
    ap.add_argument("--ks", type=int, nargs="+", default=[7, 5, 3, 1])
    ap.add_argument("--vocabs", nargs="+", default=["v32k", "vfull"], choices=["v32k", "vfull"])
    ap.add_argument("--configs", nargs="*", help="subset of the configurations, in this order")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no CUDA graphs)")
    ap.add_argument(
        "--capture",
        choices=["tokens", "requests"],
        default="tokens",
        help="CUDA-graph sizes: token counts B x (K + 1) (the deprecated keys 0.26 reads) or "
        "decode request counts B (vLLM >= 0.34's decode_cudagraph_capture_request_sizes)",
    )
    ap.add_argument(
        "--dispatch-log",
        action="store_true",
        help="count each decode batch's CUDA-graph dispatch (mode, tokens, requests) per model",
    )
    ap.add_argument("--child-timeout", type=float, default=150, help="seconds per engine")
    ap.add_argument("--budget-s", type=float, default=1e9, help="no engine starts after this")
    ap.add_argument("--build-only", action="store_true", help="write the folders and stop")
    ap.add_argument("--redo", action="store_true", help="rerun configurations already in --out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--draft-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
