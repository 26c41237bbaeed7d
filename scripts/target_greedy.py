"""The target's own greedy answers, as references: stop ids, cutting at a stop, batched
left-padded `generate`. Used by the serve-time gate (vLLM against the engine) and the draft
vocabulary ceiling (scripts/draft_vocab_coverage.py)."""

from __future__ import annotations

import torch


def stop_ids(target: str) -> set[int]:
    """The target's eos ids (its generation config may list several)."""
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(target).eos_token_id
    return set(eos if isinstance(eos, list) else [eos])


def cut(seqs: list[list[int]], stops: set[int]) -> list[list[int]]:
    """Each sequence up to (not including) its first stop id: stacks differ on echoing it."""
    out = []
    for s in seqs:
        first = next((i for i, t in enumerate(s) if t in stops), len(s))
        out.append(list(s[:first]))
    return out


def greedy_answers(
    model, prompts: list[list[int]], max_tokens: int, batch: int | None = None
) -> list[list[int]]:
    """`model`'s greedy continuation of each prompt, `batch` prompts per left-padded `generate`
    call (None: all in one; the batch shape changes rounding, so a reference fixes it)."""
    pad = model.generation_config.pad_token_id or 0
    device = model.device
    batch = batch or len(prompts)
    out = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        with torch.no_grad():
            g = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False
            )
        out += [row[width:].tolist() for row in g]
    return out
