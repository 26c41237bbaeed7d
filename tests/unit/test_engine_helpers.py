"""Builders shared by the engine and HTTP tests (no tests here): a tiny Qwen3 target with a
word-level tokenizer and chat template, random or "tuned" DSpark drafts, folders on disk, and
the wait for a served process's /health.

A *predictable* target has every attention output projection zeroed, so its next token is a
fixed function f(current token); a *tuned* draft's Markov head is set to draft exactly f, so
acceptance is high whatever the backbone says. Float64 keeps argmax free of near-ties.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

from common.checkpoint import save_checkpoint
from common.config import DSparkConfig
from common.model import DSparkDraftModel
from common.vocab import build_vocab_map
from tests.tiny import tiny_target_config, word_tokenizer

V = 96
SPECIAL = ["<pad>", "<eos>", "<mask>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
EOS, MASK = 1, 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer() -> PreTrainedTokenizerFast:
    words = SPECIAL + [f"w{i}" for i in range(V - len(SPECIAL))]
    return word_tokenizer(
        words, CHAT_TEMPLATE, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def target_config(layers: int = 4):
    return tiny_target_config(
        V, 32, layers, max_position_embeddings=512, eos_token_id=EOS, pad_token_id=0
    )


def make_target(seed: int = 0, predictable: bool = False, sharpness: float = 1.0):
    """Random float64 target; `predictable`: attention outputs zeroed (next token depends on the
    current token only); `sharpness` scales the lm_head (peakier distributions at T = 1)."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(target_config()).to(torch.float64).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
        if predictable:
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
    return model


def transition_matrix(target, temperature: float = 1.0) -> torch.Tensor:
    """[V, V] P[v, w] = p(next = w | current = v) of a predictable target at `temperature`."""
    with torch.no_grad():
        logits = target(torch.arange(V).view(-1, 1)).logits[:, -1]
    return torch.softmax(logits / temperature, dim=-1)


def next_token_map(target) -> torch.Tensor:
    """[V] f(v) = the predictable target's greedy next token after v (context-free)."""
    return transition_matrix(target).argmax(-1)


def make_draft(
    target,
    sample_from_anchor: bool = True,
    draft_vocab: int | None = None,
    tuned: bool = False,
    seed: int = 1,
    block_size: int = 4,
    strength: float = 1e3,
    confidence: bool = True,
) -> DSparkDraftModel:
    """A random DSpark draft for `target` (float64); `tuned` = its Markov head adds `strength`
    to the logit of f(prev), so it drafts f (needs a predictable target); a small strength gives
    spread-out draft distributions. A reduced vocab keeps the ids f reaches plus a few more."""
    torch.manual_seed(seed)
    cfg = DSparkConfig.from_target(
        target.config,
        mask_token_id=MASK,
        num_hidden_layers=1,
        block_size=block_size,
        markov_rank=V if tuned else 8,
        intermediate_size=64,
        head_dim=8,
        draft_vocab_size=draft_vocab,
        sample_from_anchor=sample_from_anchor,
        target_layer_ids=[0, 2],
        enable_confidence_head=confidence,
    )
    draft = DSparkDraftModel(cfg).to(torch.float64)
    kw = {}
    f = next_token_map(target) if tuned else None
    if draft_vocab is not None:
        counts = torch.zeros(V, dtype=torch.long)
        if f is not None:
            counts.scatter_add_(0, f, torch.ones(V, dtype=torch.long))
        counts += torch.arange(V).flip(0) % 3  # some spread so the map is not trivial
        vm = build_vocab_map(counts, draft_vocab)
        kw = {"d2t": vm.d2t, "t2d": vm.t2d}
    draft.init_from_target(target.get_input_embeddings().weight, target.lm_head.weight, **kw)
    if tuned:
        with torch.no_grad():
            mh = draft.markov_head
            mh.markov_w1.weight.copy_(torch.eye(V, dtype=torch.float64))
            mh.markov_w2.weight.zero_()
            selected = draft.draft_ids_in_target.tolist()
            row = {t: d for d, t in enumerate(selected)}
            for v in range(V):
                if int(f[v]) in row:
                    mh.markov_w2.weight[row[int(f[v])], v] = strength
    return draft.eval()


def reference_greedy(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    """HF `generate`, greedy, no eos stop (explicit all-ones mask: id 0 is the pad id)."""
    ids = torch.tensor([prompt])
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def save_target(target, out: Path) -> Path:
    target.save_pretrained(out)
    make_tokenizer().save_pretrained(out)
    return out


def save_draft(draft: DSparkDraftModel, out: Path) -> Path:
    return save_checkpoint(draft, out, dtype=torch.float64, include_embed=True)


def wait_healthy(
    base: str,
    procs: list[subprocess.Popen],
    log_tail: Callable[[int], str],
    timeout_s: float,
    poll_s: float,
) -> None:
    """Poll `base`/health until it answers 200; fail the test, with process i's log tail, as soon
    as process i exits, or with process 0's once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        for i, p in enumerate(procs):
            if p.poll() is not None:
                pytest.fail(f"server process {i} exited ({p.returncode}):\n{log_tail(i)}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"server not healthy after {timeout_s}s:\n{log_tail(0)}")
        time.sleep(poll_s)
