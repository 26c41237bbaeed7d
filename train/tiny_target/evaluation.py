"""Held-out loss and a greedy sample for the tiny target.

Design choices:
- Held-out rows are scored one conversation per sequence (no packing), truncated to the training
  seq_len, so the number matches what a chat-serving target sees.
- Losses are (sum, count) pairs, divided last; "assistant" loss counts the tokens whose *target*
  is under the template's assistant mask (the part a draft model is distilled on).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from train.tiny_target.train import autocast


def encode_rows(
    tokenizer, rows: list[dict], seq_len: int
) -> list[tuple[list[int], list[int], str]]:
    """(input_ids, assistant_mask, domain) per row, rendered with the chat template, truncated."""
    enc = tokenizer.apply_chat_template(
        [r["messages"] for r in rows],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    return [
        (ids[:seq_len], mask[:seq_len], r["domain"])
        for ids, mask, r in zip(enc["input_ids"], enc["assistant_masks"], rows)
    ]


def spread(rows: list, n: int) -> list:
    """At most `n` rows evenly spaced over `rows` (held-out rows come grouped by document)."""
    if len(rows) <= n:
        return list(rows)
    return [rows[i * len(rows) // n] for i in range(n)]


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    encoded: list[tuple[list[int], list[int], str]],
    pad_id: int,
    device: torch.device,
    bf16: bool,
    batch_size: int = 16,
) -> dict:
    """Next-token loss on held-out chats: `encoded` holds (ids, assistant_mask, domain) per row.

    Returns mean NLL (nats) over all predicted tokens, over assistant-mask tokens only, and per
    domain (all tokens); the mask of the *predicted* token decides membership.
    """
    model.eval()
    sums: dict[str, list[float]] = {}  # name -> [nll sum, token count]
    for i in range(0, len(encoded), batch_size):
        chunk = encoded[i : i + batch_size]
        width = max(len(ids) for ids, _, _ in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        valid = torch.zeros((len(chunk), width), dtype=torch.long)
        amask = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, (row_ids, row_mask, _) in enumerate(chunk):
            ids[r, : len(row_ids)] = torch.tensor(row_ids)
            valid[r, : len(row_ids)] = 1
            amask[r, : len(row_mask)] = torch.tensor(row_mask)
        ids, valid, amask = ids.to(device), valid.to(device), amask.to(device)
        with autocast(device, bf16):
            logits = model(input_ids=ids, attention_mask=valid).logits  # [B, T, V]
        nll = F.cross_entropy(
            logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
        ).view(len(chunk), width - 1)  # [B, T-1]
        keep, asst = valid[:, 1:].float(), amask[:, 1:].float()
        row_sums = torch.stack([(nll * keep).sum(1), keep.sum(1), (nll * asst).sum(1), asst.sum(1)])
        for r, (_, _, domain) in enumerate(chunk):  # row_sums: [4, B]
            nll_all, n_all, nll_asst, n_asst = row_sums[:, r].tolist()
            for key, s, n in (
                ("all", nll_all, n_all),
                (f"domain:{domain}", nll_all, n_all),
                ("assistant", nll_asst, n_asst),
            ):
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0], acc[1] = acc[0] + s, acc[1] + n
    model.train()
    out = {
        "heldout_loss": sums["all"][0] / max(1.0, sums["all"][1]),
        "heldout_assistant_loss": sums["assistant"][0] / max(1.0, sums["assistant"][1]),
        "heldout_tokens": int(sums["all"][1]),
        "heldout_assistant_tokens": int(sums["assistant"][1]),
        "heldout_rows": len(encoded),
    }
    out["heldout_loss_by_domain"] = {
        k.split(":", 1)[1]: s / max(1.0, c) for k, (s, c) in sums.items() if k.startswith("domain:")
    }
    return out


@torch.no_grad()
def greedy_sample(model, tokenizer, row: dict, device: torch.device, max_new_tokens: int) -> dict:
    """Greedy continuation of `row`'s first user turn (messages before the first assistant)."""
    first_asst = next(i for i, m in enumerate(row["messages"]) if m["role"] == "assistant")
    prompt = row["messages"][:first_asst]
    enc = tokenizer.apply_chat_template(
        prompt, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    ).to(device)
    model.eval()
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    n_prompt = enc["input_ids"].shape[1]
    return {
        "source": row["source"],
        "prompt": prompt[-1]["content"],
        "reference": row["messages"][first_asst]["content"],
        "completion": tokenizer.decode(out[0, n_prompt:], skip_special_tokens=False),
    }
