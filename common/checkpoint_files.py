"""What a DSpark checkpoint folder is made of, and how its config.json is read back.

The file names, the fp32 key prefix, the speculators layout's top-level DSpark keys and key
renames, which tensors the target owns, and `read_config` live here, below both the writer
(`common.checkpoint`) and the checker (`common.contract`): the writer validates with the checker,
and the checker reads folders with these names, so neither needs the other's module imported
first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from common.checkpoint_errors import read_json_file
from common.config import DSparkConfig

CONFIG_NAME, WEIGHTS_NAME, PROVENANCE_NAME = "config.json", "model.safetensors", "provenance.json"
FP32_KEYS_PREFIX = "confidence_head."
# Keys the speculators layout writes at the top level of config.json (vLLM's `update_dspark`
# reads them there), not under `transformer_layer_config`.
DSPARK_TOP_LEVEL_KEYS = (
    "draft_vocab_size",
    "target_hidden_size",
    "mask_token_id",
    "markov_rank",
    "markov_head_type",
    "block_size",
    "enable_confidence_head",
    "confidence_head_with_markov",
    "sample_from_anchor",
    "target_layer_ids",
    "target_num_hidden_layers",
    "dspark_bonus_anchor",
    "target_logit_softcap",
    "target_config_hash",
)


TARGET_OWNED = ("embed_tokens.weight", "lm_head.weight")
# The speculators layout names the gated / rnn Markov projections as `speculators` does (its
# `MarkovHead.gate_proj` / `joint_proj`, same input order); every other key is shared.
SPECULATORS_RENAMES = {
    "markov_head.markov_gate.": "markov_head.gate_proj.",
    "markov_head.markov_rnn.": "markov_head.joint_proj.",
}


def layout_key(name: str, speculators: bool, to_ours: bool = False) -> str:
    """Our parameter name -> its key in the file (or back with `to_ours`)."""
    if not speculators:
        return name
    for ours, theirs in SPECULATORS_RENAMES.items():
        src, dst = (theirs, ours) if to_ours else (ours, theirs)
        if name.startswith(src):
            return dst + name[len(src) :]
    return name


def shared_with_target(cfg: DSparkConfig) -> tuple[str, ...]:
    """Keys the draft takes from the target rather than owning: its input embedding always (the
    draft's hidden size is the target's and the table is frozen), and its lm_head when the draft
    vocabulary is the full one (with a reduced vocabulary the lm_head rows are the draft's own).
    vLLM's `load_dspark_model` (0.26-0.34) aliases the target's tensors for missing keys."""
    return TARGET_OWNED if not cfg.reduced_vocab else TARGET_OWNED[:1]


def is_speculators_config(raw: dict) -> bool:
    return "speculators_config" in raw


def read_config(ckpt_dir: str | os.PathLike) -> DSparkConfig:
    """DSparkConfig from either layout's config.json (CheckpointFileError when it is missing or not
    JSON)."""
    d = read_json_file(Path(ckpt_dir) / CONFIG_NAME)
    if is_speculators_config(d):
        d = _flatten_speculators(d)
    return DSparkConfig.from_hf_dict(d)


def _flatten_speculators(d: dict) -> dict:
    """The flat DSpark dict of a speculators-layout config.json, ours or one `speculators`
    wrote (which has no target_layer_ids / target_num_hidden_layers, may write
    `target_hidden_size: null`, and keeps rope_theta only under rope_parameters)."""
    flat = dict(d.get("transformer_layer_config") or {})
    flat.update({k: d[k] for k in DSPARK_TOP_LEVEL_KEYS if d.get(k) is not None})
    if "target_layer_ids" not in flat:
        flat["target_layer_ids"] = [i - 1 for i in d["aux_hidden_state_layer_ids"]]
    flat.setdefault("target_hidden_size", flat.get("hidden_size"))
    rope = flat.get("rope_parameters") or {}
    if flat.get("rope_theta") is None and "rope_theta" in rope:
        flat["rope_theta"] = rope["rope_theta"]
    if "target_num_hidden_layers" not in flat:
        verifier = (d["speculators_config"].get("verifier") or {}).get("name_or_path") or ""
        vcfg = Path(verifier) / CONFIG_NAME if verifier else None
        if vcfg is not None and vcfg.is_file():
            text = json.loads(vcfg.read_text())
            text = text.get("text_config") or text
            if "num_hidden_layers" in text:
                flat["target_num_hidden_layers"] = int(text["num_hidden_layers"])
    flat.setdefault("sample_from_anchor", False)  # vLLM's default for this layout
    return flat
