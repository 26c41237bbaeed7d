"""The reduced draft vocabulary of a run, ranked by the training rows' supervised tokens and
cached."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from common.config import DSparkConfig
from common.vocab import VocabMap, build_vocab_map, counts_hash
from train.data import count_loss_tokens


def vocab_map_for(cfg: DSparkConfig, train_ds, cache_path: Path) -> VocabMap | None:
    """Counts loss-masked tokens -> VocabMap; a cached map is reused only for the same counts
    hash and size."""
    if not cfg.reduced_vocab:
        return None
    counts = count_loss_tokens(train_ds, cfg.vocab_size)
    h = counts_hash(counts)
    meta = cache_path.with_suffix(".json")
    if cache_path.exists() and meta.exists():
        m = json.loads(meta.read_text())
        if m.get("counts_hash") == h and m.get("draft_vocab_size") == cfg.draft_vocab_size:
            saved = torch.load(cache_path)
            return VocabMap(saved["d2t"], saved["t2d"], h, cfg.draft_vocab_size)
    vm = build_vocab_map(counts, cfg.draft_vocab_size)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(vm.to_dict(), cache_path)
    meta.write_text(json.dumps({"counts_hash": h, "draft_vocab_size": cfg.draft_vocab_size}))
    return vm
