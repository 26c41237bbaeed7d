"""What a DSpark checkpoint folder is made of, and how its config.json is read back.

The file names, the fp32 key prefix, the speculators layout's top-level DSpark keys and
`read_config` live here, below both the writer (`common.checkpoint`) and the checker
(`common.contract`): the writer validates with the checker, and the checker reads folders with
these names, so neither needs the other's module to be imported first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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
)


def read_config(ckpt_dir: str | os.PathLike) -> DSparkConfig:
    """DSparkConfig from either layout's config.json."""
    d = json.loads((Path(ckpt_dir) / CONFIG_NAME).read_text())
    if "speculators_config" in d:
        flat = dict(d.get("transformer_layer_config") or {})
        flat.update({k: d[k] for k in DSPARK_TOP_LEVEL_KEYS if k in d})
        if "target_layer_ids" not in d:
            flat["target_layer_ids"] = [i - 1 for i in d["aux_hidden_state_layer_ids"]]
        flat.setdefault("sample_from_anchor", False)  # vLLM's default for this layout
        d = flat
    return DSparkConfig.from_hf_dict(d)
