"""`init_layers_from_target=[IDS]`: start the draft's decoder layers from the target's own.

The draft's layers have the target's shapes (hidden size, heads, MLP width, by default) and the
same parameter names (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, the two layer norms), so
each can begin as a copy of a target layer instead of random weights: draft layer i from target
layer IDS[i] (negative ids count from the end: [-3, -2, -1] are the last three). Parameters the
target layer lacks or holds in another shape (q_norm/k_norm on a Llama target, a draft narrower
than the target) keep their fresh init and are named in the returned report. The draft's other
parts (the fusing fc, the Markov and confidence heads) start fresh as before.
"""

from __future__ import annotations

import torch

from common.model import DSparkDraftModel
from common.target import decoder_layers
from train.errors import SetupError


def resolve_layer_ids(ids: list[int], num_target_layers: int, num_draft_layers: int) -> list[int]:
    """`ids` as non-negative target layer indices; a SetupError unless there is one per draft
    layer and each names a target layer."""
    if len(ids) != num_draft_layers:
        raise SetupError(
            f"init_layers_from_target={list(ids)} names {len(ids)} target layers for a draft of "
            f"{num_draft_layers} layers (draft.num_hidden_layers): give one id per draft layer"
        )
    out = []
    for i in ids:
        if not -num_target_layers <= i < num_target_layers:
            raise SetupError(
                f"init_layers_from_target: {i} is not a layer of the target ({num_target_layers} "
                f"layers: 0..{num_target_layers - 1}, or -1..-{num_target_layers})"
            )
        out.append(i % num_target_layers)
    return out


@torch.no_grad()
def copy_target_layers(draft: DSparkDraftModel, target, ids: list[int]) -> dict:
    """Copy target layers `ids` into the draft's layers (in place, the draft's dtype kept).
    Returns {"target_layers", "copied", "kept_fresh"}: the resolved ids and the per-layer
    parameter names copied or left at their fresh init."""
    source = decoder_layers(target)
    ids = resolve_layer_ids(list(ids), len(source), len(draft.layers))
    copied: set[str] = set()
    kept: set[str] = set()
    for layer, i in zip(draft.layers, ids, strict=True):
        theirs = dict(source[i].named_parameters())
        for name, p in layer.named_parameters():
            src = theirs.get(name)
            if src is None or src.shape != p.shape:
                kept.add(name)
                continue
            p.copy_(src.to(device=p.device, dtype=p.dtype))
            copied.add(name)
    return {"target_layers": ids, "copied": sorted(copied), "kept_fresh": sorted(kept - copied)}
