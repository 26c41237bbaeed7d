"""Train-to-serve parity: does the served draft accept what the draft the trainer measured does?

    python -m serve.parity CHECKPOINT --target DIR --prompts FILE [--max-prompts 32]
        [--max-new-tokens 32] [--seed 0] [--reference auto|vllm|teacher-forced] [--json OUT]

The most common silent failure is a draft that validates well and serves at near-zero acceptance
(a layout key missing, layer ids off by one, a d2t map misread). This command runs the draft in
the embedded engine and in an independent reference on the same prompts, seeds and sampling, at
T=0 and T=1, and compares per-position conditional acceptance (accepted at k / rounds reaching k).

References:
- `vllm` (vLLM installed with a GPU): vLLM's own DSpark speculative decoding, request i seeded
  seed + i on both sides, counters from vLLM's metrics.
- `teacher-forced` (everywhere else: vLLM's CPU build cannot run DSpark decoding; it picks its V1
  model runner, which refuses "dspark speculative decoding", and its V2 runner needs Triton): the
  trainer's code path on the engine's served text. The target is loaded again through
  transformers, its hidden states captured as in training (`TargetCapture`), the draft loaded from
  the checkpoint and run teacher-forced (`forward_train`, `block_logits`). A round that reaches
  slot k has accepted the drafts before it, so they equal the served text, and slot k is then
  accepted with probability sum(min(p_target, q_draft)) at that context (the argmax agreement at
  T=0). Summed over the rounds the engine served, this is the expected number of acceptances at
  k, which the engine's realized count must match.
- `auto`: vllm where it can run, else teacher-forced.
Requests ignore end-of-sequence tokens, so every prompt decodes exactly --max-new-tokens tokens;
a round's slots past the decoded text are counted on neither side.

The criterion, fixed here before any result: at each temperature and position, a two-sided
two-proportion z-test (pooled standard error) of the engine's rate against the reference's, the
family of all (temperature, position) tests held at ALPHA by Bonferroni. Rounds of one prompt are
correlated and the teacher-forced side is an expectation, so the binomial variance errs towards
failing. The minimum detectable difference (MDD) at 80% power, with the worst-case variance
0.25, is printed per position; the check also fails when it exceeds MAX_MDD at position 0 (a test
without power could not fail). Exit 0: parity; 1: a mismatch or too few rounds; 2: bad input.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from common.acceptance import two_proportion_test
from common.atomic_file import write_whole
from common.checkpoint import load_checkpoint
from common.model import block_label_positions
from common.sampling.gumbel import sampled_probs
from common.target import TargetCapture, softcap_logits, target_logit_softcap
from serve.engine import Engine
from serve.engine.options import EngineOptions, OptionsError
from serve.evaluate import BadInput, load_prompts, run_prompts

ALPHA = 0.01  # family-wise, over every (temperature, position) test
MAX_MDD = 0.2  # the largest minimum detectable difference allowed at position 0
POWER = 0.8
TEMPERATURES = (0.0, 1.0)


# ------------------------------------------------------------------ teacher-forced reference
class TeacherForced:
    """The target (transformers) and the draft (checkpoint), loaded apart from the engine."""

    def __init__(self, target: str, checkpoint: str, dtype: torch.dtype, device: str):
        from transformers import AutoModelForCausalLM

        self.target = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
        self.draft = load_checkpoint(
            checkpoint,
            dtype=dtype,
            device=device,
            target_embed=self.target.get_input_embeddings().weight.detach().cpu(),
            target_lm_head=self.target.get_output_embeddings().weight.detach().cpu(),
        ).eval()
        self.device = device
        self.cap = TargetCapture(self.target, self.draft.config.target_layer_ids)
        self.softcap = target_logit_softcap(self.target)

    @torch.no_grad()
    def slot_acceptance(self, ids: list[int], anchors: list[int], t: float) -> torch.Tensor:
        """[A, Nd] float64: the probability each slot of a round anchored at each of `anchors`
        is accepted once the slots before it are, the drafts before it being `ids` itself."""
        cfg = self.draft.config
        # One placeholder token past the text: a slot whose context ends at the last token still
        # has an in-range label position (its label is never read).
        x = torch.tensor([ids + [0]], device=self.device)
        anc = torch.tensor([anchors], device=self.device)
        out = self.cap(x)
        fo = self.draft.forward_train(out.aux, x, anc, torch.ones_like(anc, dtype=torch.bool))
        dlogits = self.draft.block_logits(fo.hidden, fo.markov_input)[0].double()  # [A, Nd, Vd]
        if cfg.dspark_draft_topk is not None:  # the walk samples among the top k only
            kth = dlogits.topk(cfg.dspark_draft_topk, dim=-1).values[..., -1:]
            dlogits = dlogits.masked_fill(dlogits < kth, float("-inf"))
        valid = torch.ones_like(anc, dtype=torch.bool)
        label_pos, _ = block_label_positions(anc, valid, cfg.num_speculative_tokens, x.shape[1])
        final = out.final[0, label_pos[0] - 1]  # [A, Nd, H]: the context of each slot
        tlogits = softcap_logits(self.target.get_output_embeddings()(final), self.softcap)
        a, nd, v = tlogits.shape
        temp = torch.full((a * nd,), t, dtype=torch.float64, device=self.device)
        p = sampled_probs(tlogits.reshape(a * nd, v).double(), temp).double()
        q_draft = sampled_probs(dlogits.reshape(a * nd, -1), temp).double()
        cols = self.draft.map_draft_to_target(torch.arange(q_draft.shape[1], device=self.device))
        q = torch.zeros_like(p).index_add_(1, cols, q_draft)
        return torch.minimum(p, q).sum(-1).view(a, nd)


def round_anchors(prompt_len: int, rounds: list[int]) -> list[int]:
    """Index (in prompt + output) of each round's anchor: the prefill emits the token at
    `prompt_len`; a round anchored at p that accepts a drafts anchors the next at p + a + 1."""
    out, p = [], prompt_len
    for a in rounds:
        out.append(p)
        p += a + 1
    return out


def teacher_forced_counts(ref: TeacherForced, prompts, results, t: float, nd: int) -> dict:
    """Per slot, over the engine's rounds whose slot lies within the text: rounds that reached it,
    the engine's acceptances there, and the reference's expected acceptances."""
    reached, accepted, expected = [0] * nd, [0] * nd, [0.0] * nd
    pairs = zip(prompts, results, strict=True)
    bar = tqdm(pairs, total=len(prompts), desc=f"reference T={t:g}", unit="prompt", leave=False)
    for prompt, (out, rounds) in bar:
        ids = list(prompt) + list(out)
        anchors = round_anchors(len(prompt), rounds)
        alpha = ref.slot_acceptance(ids, anchors, t)
        for j, (p, a) in enumerate(zip(anchors, rounds, strict=True)):
            for k in range(min(a, nd - 1) + 1):  # slots the round reached
                if p + 1 + k > len(ids):  # its context runs past the decoded text
                    break
                reached[k] += 1
                accepted[k] += int(a > k)
                expected[k] += float(alpha[j, k])
    return {"reached": reached, "engine": accepted, "reference": expected}


# ------------------------------------------------------------------ vLLM reference
def vllm_runs_here() -> bool:
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def vllm_counts(a, prompts, nd: int) -> dict[float, tuple[list[int], list[int]]]:
    """{T: (accepted per position, reached per position)} of vLLM's DSpark decoding."""
    from vllm import LLM, SamplingParams

    from common.checkpoint import read_config
    from common.spec_config import speculative_config

    spec = speculative_config(read_config(a.checkpoint), a.checkpoint, num_speculative_tokens=nd)
    llm = LLM(
        model=a.target,
        dtype=a.dtype,
        max_model_len=a.max_prompt_tokens + a.max_new_tokens + nd + 1,
        seed=a.seed,
        enforce_eager=True,
        disable_log_stats=False,
        speculative_config=spec,
    )

    def counters():
        c = {"drafts": 0, "per_pos": [0] * nd}
        for m in llm.get_metrics():
            if m.name == "vllm:spec_decode_num_drafts":
                c["drafts"] = m.value
            elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                c["per_pos"] = list(m.values)
        return c

    out = {}
    inputs = [{"prompt_token_ids": p} for p in prompts]
    for t in TEMPERATURES:
        before = counters()
        params = [
            SamplingParams(max_tokens=a.max_new_tokens, temperature=t, seed=a.seed + i,
                           ignore_eos=True)
            for i in range(len(prompts))
        ]  # fmt: skip
        llm.generate(inputs, params)
        after = counters()
        acc = [x - y for x, y in zip(after["per_pos"], before["per_pos"], strict=True)]
        reached = [after["drafts"] - before["drafts"], *acc[:-1]]
        out[t] = (acc, reached)
    return out


# ------------------------------------------------------------------ comparison
def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m serve.parity", description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="the exported draft folder")
    ap.add_argument("--target", required=True, help="the target's HF folder")
    ap.add_argument("--prompts", required=True, help="JSONL rows with `messages` or `prompt`")
    ap.add_argument("--max-prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-prompt-tokens", type=int, default=768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", choices=("auto", "vllm", "teacher-forced"), default="auto")
    ap.add_argument("--json", help="write the comparison here")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args(argv)
    for path, what in ((a.checkpoint, "folder"), (a.target, "folder"), (a.prompts, "file")):
        if not (Path(path).is_dir() if what == "folder" else Path(path).is_file()):
            raise BadInput(f"{path} is not an existing {what}")
    if a.max_prompts < 1 or a.max_new_tokens < 1:
        raise BadInput("--max-prompts and --max-new-tokens must be at least 1")
    if a.reference == "vllm" and not vllm_runs_here():
        raise BadInput("--reference vllm needs vLLM installed and a GPU (its CPU build cannot "
                       "run DSpark decoding); use --reference teacher-forced")  # fmt: skip
    return a


def run(a) -> tuple[list[dict], bool, dict]:
    engine = Engine.from_options(
        EngineOptions(
            target=a.target,
            checkpoint=a.checkpoint,
            device=a.device,
            dtype=a.dtype,
            draft_sampling="probabilistic",
            max_num_seqs=a.batch,
            max_model_len=a.max_prompt_tokens + a.max_new_tokens,
            seed=a.seed,
        )
    )
    if engine.tokenizer is None:
        raise BadInput(f"--target {a.target} has no tokenizer to render prompts with")
    by_dom, _ = load_prompts(
        a.target, engine.tokenizer, a.max_prompts, {"prompts": a.prompts}, a.max_prompt_tokens
    )
    prompts = by_dom["prompts"]
    if not prompts:
        raise BadInput(f"{a.prompts}: no prompt of at most {a.max_prompt_tokens} tokens")
    nd = engine.num_spec
    use_vllm = a.reference == "vllm" or (a.reference == "auto" and vllm_runs_here())
    counts: dict[float, dict] = {}
    ref = None if use_vllm else TeacherForced(a.target, a.checkpoint, engine_dtype(a), a.device)
    for t in TEMPERATURES:
        before = engine.stats.snapshot().spec
        results = run_prompts(
            engine, prompts, t, a.max_new_tokens, a.seed, f"engine T={t:g}", ignore_eos=True
        )
        if ref is not None:
            counts[t] = teacher_forced_counts(ref, prompts, results, t, nd)
        else:
            s = engine.stats.snapshot().spec.since(before).report()
            counts[t] = {"reached": s["reached_per_pos"], "engine": s["accepted_per_pos"]}
    if use_vllm:
        for t, (acc, reached) in vllm_counts(a, prompts, nd).items():
            if reached != counts[t]["reached"]:
                # Different round counts: compare rates, each over its own rounds.
                counts[t]["reached_reference"] = reached
            counts[t]["reference"] = acc
    meta = {"reference": "vllm" if use_vllm else "teacher-forced", "prompts": len(prompts)}
    rows, passed = compare(counts)
    return rows, passed, meta | {"counts": {str(t): c for t, c in counts.items()}}


def compare(counts: dict[float, dict]) -> tuple[list[dict], bool]:
    """The per-position tests of every temperature, Bonferroni over all, each side's rate over
    its own rounds; (rows, passed)."""
    n_tests = sum(len(c["reached"]) for c in counts.values())
    alpha = ALPHA / max(n_tests, 1)
    rows, passed = [], True
    for t, c in counts.items():
        ref_n = c.get("reached_reference", c["reached"])
        for k, (n, m) in enumerate(zip(c["reached"], ref_n, strict=True)):
            test = two_proportion_test(c["engine"][k], n, c["reference"][k], m, alpha, POWER)
            rows.append({"temperature": t, "pos": k, **test})
            passed &= not test["rejects"]
            if k == 0 and (test["mdd"] is None or test["mdd"] > MAX_MDD):
                passed = False
    return rows, passed


def engine_dtype(a) -> torch.dtype:
    return getattr(torch, a.dtype)


def show(rows: list[dict], meta: dict, passed: bool) -> list[str]:
    lines = [
        f"engine vs {meta['reference']} reference, {meta['prompts']} prompts, T in "
        f"{list(TEMPERATURES)}; two-proportion z-test per position, family-wise alpha {ALPHA} "
        f"(Bonferroni over {len(rows)} tests); MDD: the difference found with {POWER:.0%} power",
        "| T | pos | rounds reaching (engine, reference) | engine | reference | p | MDD "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate = r["rate"]
        shown = [("-" if x is None else f"{x:.3f}") for x in rate]
        p = "-" if "p_value" not in r else f"{r['p_value']:.3g}"
        mdd = "-" if r["mdd"] is None else f"{r['mdd']:.3f}"
        n = f"{int(r['n'][0])}, {int(r['n'][1])}"
        verdict = "DIFFERS" if r["rejects"] else "same"
        lines.append(
            f"| {r['temperature']:g} | {r['pos']} | {n} | {shown[0]} | {shown[1]} | {p} | "
            f"{mdd} | {verdict} |"
        )
    pos0 = [r["mdd"] for r in rows if r["pos"] == 0]
    lines.append(
        "minimum detectable difference at position 0: "
        + ", ".join("-" if m is None else f"{m:.3f}" for m in pos0)
        + f" (must be <= {MAX_MDD})"
    )
    lines.append(
        "PARITY: the served draft accepts as the reference predicts"
        if passed
        else "MISMATCH: the served draft's acceptance differs from the reference's, or the "
        "test lacks power (see above); exit 1"
    )
    return lines


def main(argv=None) -> int:
    try:
        a = parse_args(argv)
        rows, passed, meta = run(a)
    except (BadInput, OptionsError) as e:
        print(f"serve.parity: {e}", file=sys.stderr)
        return 2
    print("\n".join(show(rows, meta, passed)))
    if a.json:
        report = {"passed": passed, "alpha": ALPHA, "max_mdd": MAX_MDD, "tests": rows, **meta}
        write_whole(a.json, json.dumps(report, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
