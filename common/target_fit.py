"""Does a draft fit the target it is about to be served with? One comparison for every caller.

`fit_problems(draft_cfg, target_config, tokenizer, ...)` -> one line per mismatch, naming the field
and both values; `checkpoint_fit_problems(ckpt_dir, target_dir)` reads both folders first. Callers:
`python -m serve.check CKPT --target PATH`, `serve.launch` (before either engine starts) and the
embedded engine's loader. A draft that loads without error against the wrong target is the silent
failure this guards: vLLM accepts it and acceptance collapses.

Fields: hidden size, vocab, layer count and captured layer ids, mask token (inside the vocab; the
token the mask id was chosen as, recorded in provenance.json's "mask_token", keeps its id), the
block layout (config.json vs the layout trained, recorded in provenance.json) and its positions
(rope_theta), the tokenizer (hash of its vocab, recorded at export as `target_tokenizer_hash`),
the draft's width when it needs the target's embedding, and the target's config hash (over
common.config.TARGET_HASH_KEYS, recorded at export) when nothing else differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from common.checkpoint_files import CONFIG_NAME, PROVENANCE_NAME, WEIGHTS_NAME, read_config
from common.config import DSparkConfig, target_config_hash

TOKENIZER_HASH_KEY = "target_tokenizer_hash"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def tokenizer_hash(tokenizer) -> str:
    """Hash of the token -> id table: equal for the same tokenizer saved anywhere."""
    table = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(table, ensure_ascii=False).encode()).hexdigest()[:16]


def target_text_config(target_dir: str | os.PathLike) -> dict[str, Any]:
    """The target's (text) config.json as a dict."""
    raw = json.loads((Path(target_dir) / CONFIG_NAME).read_text())
    return raw.get("text_config") or raw


def load_target_tokenizer(target_dir: str | os.PathLike):
    """The target folder's tokenizer, or None when it ships none."""
    if not any((Path(target_dir) / f).exists() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target_dir))


def _rope_theta(cfg: dict) -> float | None:
    value = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta")
    return float(value) if value is not None else None


def fit_problems(
    draft: DSparkConfig,
    target: dict[str, Any],
    tokenizer=None,
    *,
    recorded_tokenizer_hash: str | None = None,
    trained_layout: dict[str, Any] | None = None,
    recorded_mask_token: str | None = None,
    has_own_embedding: bool = True,
) -> list[str]:
    """Every way `draft` does not fit `target` (its text config dict) and `tokenizer`. A field the
    target's config does not state is not compared."""
    problems = []

    def differ(field: str, mine, theirs, why: str) -> None:
        if theirs is not None and mine != theirs:
            problems.append(f"{field}: draft {mine!r}, target {theirs!r} ({why})")

    def stated(key: str) -> int | None:
        return int(target[key]) if target.get(key) is not None else None

    vocab, hidden, n = stated("vocab_size"), stated("hidden_size"), stated("num_hidden_layers")
    differ("vocab_size", draft.vocab_size, vocab, "the draft was trained for another tokenizer")
    differ("target_hidden_size", draft.target_hidden_size, hidden, "wrong target for this draft")
    if not has_own_embedding:
        differ(
            "hidden_size",
            draft.hidden_size,
            hidden,
            "the checkpoint has no embed_tokens, so it must use the target's embedding",
        )
    if n is not None:
        bad_ids = [i for i in draft.target_layer_ids if not 0 <= i < n - 1]
        if bad_ids:
            problems.append(
                f"target_layer_ids: draft {draft.target_layer_ids}, target has {n} layers (valid "
                f"ids 0..{n - 2}): {bad_ids} out of range, wrong target for this draft"
            )
    differ("target_num_hidden_layers", draft.target_num_hidden_layers, n, "wrong target")
    if vocab is not None and not 0 <= draft.mask_token_id < vocab:
        problems.append(
            f"mask_token_id: draft {draft.mask_token_id}, target vocab is [0, {vocab}): outside it"
        )
    # An id past the tokenizer (an unused embedding row, as the Qwen3 recipe's 151669) is fine; a
    # mask chosen by name must still be that name's id in this tokenizer.
    if tokenizer is not None and recorded_mask_token:
        now = tokenizer.convert_tokens_to_ids(recorded_mask_token)
        if now != draft.mask_token_id:
            problems.append(
                f"mask_token: draft trained with {recorded_mask_token!r} = id "
                f"{draft.mask_token_id}, the target tokenizer maps it to {now}"
            )
    theta = _rope_theta(target)
    if theta is not None and abs(draft.rope_theta - theta) > 1e-6 * theta:
        problems.append(
            f"rope_theta: draft {draft.rope_theta}, target {theta} (the block's positions would "
            "be rotated differently from the target's)"
        )
    for key in ("block_size", "sample_from_anchor"):
        if trained_layout and key in trained_layout:
            trained, now = trained_layout[key], getattr(draft, key)
            if (bool(trained) if key == "sample_from_anchor" else int(trained)) != now:
                problems.append(
                    f"block layout {key}: config.json {now!r}, trained {trained!r} "
                    "(provenance.json): the layout keys were changed after training"
                )
    if not problems and draft.target_config_hash:
        served = target_config_hash(target)
        if served != draft.target_config_hash:
            problems.append(
                f"target_config_hash: draft {draft.target_config_hash}, target {served} (the "
                "target's config hash over common.config.TARGET_HASH_KEYS differs): wrong target"
            )
    if tokenizer is not None:
        if vocab is not None and len(tokenizer) > vocab:
            problems.append(
                f"tokenizer: {len(tokenizer)} tokens, target vocab_size {vocab}: tokenizer and "
                "target do not belong together"
            )
        if recorded_tokenizer_hash is not None:
            now_hash = tokenizer_hash(tokenizer)
            if now_hash != recorded_tokenizer_hash:
                problems.append(
                    f"tokenizer: draft trained with tokenizer hash {recorded_tokenizer_hash}, "
                    f"target tokenizer hash {now_hash} (another tokenizer or revision)"
                )
    return problems


def checkpoint_fit_problems(
    ckpt_dir: str | os.PathLike, target_dir: str | os.PathLike
) -> list[str]:
    """`fit_problems` for a checkpoint folder and a local target folder."""
    ckpt, target = Path(ckpt_dir), Path(target_dir)
    if not (target / CONFIG_NAME).is_file():
        return [f"target {target}: no config.json (give a local HF model folder)"]
    draft = read_config(ckpt)
    prov = {}
    if (ckpt / PROVENANCE_NAME).is_file():
        try:
            prov = json.loads((ckpt / PROVENANCE_NAME).read_text())
        except json.JSONDecodeError:
            prov = {}
    from safetensors import safe_open

    with safe_open(str(ckpt / WEIGHTS_NAME), framework="pt") as f:
        has_embed = "embed_tokens.weight" in set(f.keys())
    try:
        tokenizer = load_target_tokenizer(target)
    except (OSError, ValueError) as e:
        return [f"tokenizer: cannot load the target's tokenizer from {target}: {e}"]
    return fit_problems(
        draft,
        target_text_config(target),
        tokenizer,
        recorded_tokenizer_hash=prov.get(TOKENIZER_HASH_KEY),
        trained_layout=prov.get("dspark_config") or None,
        recorded_mask_token=recorded_mask_token(prov),
        has_own_embedding=has_embed,
    )


def recorded_mask_token(prov: dict[str, Any]) -> str | None:
    """The token string the draft's mask id was chosen as, or None when there is none to check.
    Exports record the choice as provenance["mask_token"] = {"id", "token", "how"}
    (train/init/mask_token.py; "token" is None for an embedding row no text tokenizes to). The
    resolved
    config's `draft.mask_token` is only the request ("auto" by default), so it is read only from
    exports older than that record, and only when it named a token and no id overrode it."""
    record = prov.get("mask_token")
    if isinstance(record, dict):
        return record.get("token") or None
    requested = (prov.get("resolved_config") or {}).get("draft") or {}
    name = requested.get("mask_token")
    if requested.get("mask_token_id") is not None or name in (None, "auto"):
        return None
    return name
