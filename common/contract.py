"""The vLLM checkpoint contract as code: `check_checkpoint(dir) -> list of problems`.

vLLM's DSpark loader never complains: a missing d2t stays zero, missing Markov/confidence weights
keep their random init, a wrong layout key collapses acceptance to ~1. So every way we know to get
a checkpoint silently wrong is a line here (docs/vllm-contract.md); an empty list means the folder
is what vLLM expects. Expected shapes come from instantiating the model on the meta device, so
this module and `DSparkDraftModel` cannot drift apart.

`serving_problems(ckpt, target)` is the one validation before a checkpoint is served: the contract,
then the fit to the target it is served with (`common.target_fit`). `serve.launch` runs it once per
launch; the embedded engine's loader runs it when nothing before it did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from common.checkpoint_errors import CheckpointFileError, check_safetensors_file
from common.checkpoint_files import (
    CONFIG_NAME,
    FP32_KEYS_PREFIX,
    PROVENANCE_NAME,
    WEIGHTS_NAME,
    is_speculators_config,
    layout_key,
    read_config,
    shared_with_target,
)
from common.config import VLLM_MARKOV_HEAD_TYPES, ConfigError, DSparkConfig
from common.model import DSparkDraftModel
from common.target_fit import checkpoint_fit_problems
from common.vocab import check_vocab_map

OPTIONAL_KEYS = {"embed_tokens.weight", "t2d"}  # + lm_head.weight with the full vocab


def _config_problems(raw: dict) -> list[str]:
    problems = []
    if "speculators_config" in raw:
        spec = raw["speculators_config"]
        if spec.get("algorithm") != "dspark" or raw.get("speculators_model_type") != "dspark":
            problems.append("speculators config: algorithm/speculators_model_type must be 'dspark'")
        methods = spec.get("proposal_methods") or [{}]
        if "speculative_tokens" not in methods[0]:
            problems.append("speculators config: proposal_methods[0].speculative_tokens missing")
        if "name_or_path" not in (spec.get("verifier") or {}):
            problems.append("speculators config: verifier.name_or_path missing")
        if "aux_hidden_state_layer_ids" not in raw:
            problems.append("speculators config: aux_hidden_state_layer_ids missing")
        if "sample_from_anchor" not in raw:
            problems.append(
                "speculators config: sample_from_anchor missing (vLLM then assumes the 1+N layout)"
            )
        if not isinstance(raw.get("transformer_layer_config"), dict):
            problems.append("speculators config: transformer_layer_config must be a dict")
        return problems
    if raw.get("architectures") != ["Qwen3DSparkModel"]:
        problems.append(
            f"architectures={raw.get('architectures')}: must be ['Qwen3DSparkModel'] (any other "
            "name makes vLLM treat the draft as DeepSeek-V4's embedded head)"
        )
    for key in ("sample_from_anchor", "dspark_bonus_anchor"):
        if key not in raw:
            problems.append(f"config.json lacks {key}: write both layout keys")
    if raw.get("is_causal"):
        problems.append("config.json sets is_causal: the draft's block attention is non-causal")
    for key in ("target_layer_ids", "target_hidden_size", "block_size", "mask_token_id"):
        if key not in raw:
            problems.append(f"config.json lacks {key}")
    return problems


def _layout_problems(raw: dict, cfg: DSparkConfig, d: Path) -> list[str]:
    """Both layout keys flipped together stay consistent with each other, so the keys alone cannot
    show it; the draft count written next to them and the trained config in provenance.json can."""
    problems = []
    n = cfg.num_speculative_tokens
    layout = f"sample_from_anchor={cfg.sample_from_anchor}, block_size={cfg.block_size}"
    if "speculators_config" in raw:
        methods = raw["speculators_config"].get("proposal_methods") or [{}]
        written, name = methods[0].get("speculative_tokens"), "speculative_tokens"
        aux = raw.get("aux_hidden_state_layer_ids")
        if aux is not None and list(aux) != [i + 1 for i in cfg.target_layer_ids]:
            problems.append(
                f"aux_hidden_state_layer_ids={aux} != target_layer_ids+1 "
                f"{[i + 1 for i in cfg.target_layer_ids]}: the two ids lists disagree"
            )
    else:
        written, name = raw.get("num_speculative_tokens"), "num_speculative_tokens"
    if written is not None and written != n:
        problems.append(
            f"{name}={written} but the layout ({layout}) drafts {n} (B anchor-first, B-1 for 1+N):"
            " are the layout keys swapped?"
        )
    prov = d / PROVENANCE_NAME
    if prov.is_file():
        try:
            trained = json.loads(prov.read_text()).get("dspark_config") or {}
        except (json.JSONDecodeError, AttributeError):
            trained = {}
        if "sample_from_anchor" in trained and bool(trained["sample_from_anchor"]) != bool(
            cfg.sample_from_anchor
        ):
            problems.append(
                f"config.json says sample_from_anchor={cfg.sample_from_anchor} but the draft was "
                f"trained with sample_from_anchor={trained['sample_from_anchor']} "
                "(provenance.json): the layout keys were changed after training"
            )
    return problems


def check_checkpoint(ckpt_dir: str | os.PathLike, require_vllm_servable: bool = False) -> list[str]:
    """Every contract violation of the folder, one human-readable line each."""
    d = Path(ckpt_dir)
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (d / name).is_file():
            return [f"{d / name} is missing"]
    try:  # a truncated or corrupt file: one line, not safetensors' traceback below
        check_safetensors_file(d / WEIGHTS_NAME)
    except CheckpointFileError as e:
        return [str(e)]
    try:
        raw = json.loads((d / CONFIG_NAME).read_text())
    except json.JSONDecodeError as e:
        return [f"config.json is not valid JSON: {e}"]
    problems = _config_problems(raw)
    try:
        cfg = read_config(d)
    except (ConfigError, KeyError, TypeError) as e:
        return [*problems, f"config.json does not describe a valid DSpark draft: {e}"]
    problems += _layout_problems(raw, cfg, d)
    if require_vllm_servable and cfg.markov_head_type not in VLLM_MARKOV_HEAD_TYPES:
        problems.append(
            f"markov_head_type={cfg.markov_head_type!r}: stock vLLM serves only "
            f"{' / '.join(VLLM_MARKOV_HEAD_TYPES)} "
            "(serve gated/rnn with the embedded engine or a vLLM model plugin)"
        )
    with torch.device("meta"):
        ours = DSparkDraftModel(cfg).state_dict()
    spec = is_speculators_config(raw)
    expected = {layout_key(k, spec): v for k, v in ours.items()}
    if not cfg.reduced_vocab:
        expected.pop("d2t"), expected.pop("t2d")
    try:
        problems += _weight_problems(d, cfg, expected, spec)
    except SafetensorError as e:  # truncated or not a safetensors file at all
        return [*problems, f"{d / WEIGHTS_NAME} cannot be read (truncated or corrupt?): {e}"]
    return problems


def _weight_problems(d: Path, cfg: DSparkConfig, expected: dict, spec: bool) -> list[str]:
    problems = []
    with safe_open(str(d / WEIGHTS_NAME), framework="pt") as f:
        keys = set(f.keys())
        prefixed = sorted(k for k in keys if k.startswith("model."))
        if prefixed:
            problems.append(
                f"{len(prefixed)} keys carry a 'model.' prefix (e.g. {prefixed[0]}): vLLM adds it "
                "itself, so these would load nowhere"
            )
        optional = OPTIONAL_KEYS | set(shared_with_target(cfg))
        for k in sorted(set(expected) - keys - optional):
            problems.append(f"missing tensor {k} {tuple(expected[k].shape)}")
        for k in sorted(keys - set(expected) - {p for p in prefixed}):
            problems.append(f"unexpected tensor {k} (vLLM would fail or ignore it)")
        float_dtypes = set()
        for k in sorted(keys & set(expected)):
            t = f.get_slice(k)
            shape, dtype = tuple(t.get_shape()), t.get_dtype()
            if shape != tuple(expected[k].shape):
                problems.append(f"{k}: shape {shape}, expected {tuple(expected[k].shape)}")
            if k == "d2t":
                if dtype != "I64":
                    problems.append(f"d2t: dtype {dtype}, must be int64")
                else:
                    problems += check_vocab_map(f.get_tensor(k), cfg.vocab_size)
            elif k == "t2d":
                continue
            elif k.startswith(FP32_KEYS_PREFIX):
                if dtype != "F32":
                    problems.append(f"{k}: dtype {dtype}, the confidence head must be float32")
            else:
                float_dtypes.add(dtype)
        if len(float_dtypes) > 1:
            problems.append(f"backbone tensors mix dtypes {sorted(float_dtypes)}")
    if cfg.reduced_vocab and "lm_head.weight" not in keys:
        problems.append("draft_vocab_size < vocab_size but lm_head.weight is missing")
    return problems


def serving_problems(
    ckpt_dir: str | os.PathLike, target: str | os.PathLike | None
) -> tuple[list[str], list[str]]:
    """-> (contract problems, target-fit problems): the one validation before serving. The fit is
    compared only when the contract holds (a broken folder cannot be read for it) and `target` is
    a local folder (a Hub id is not downloaded here)."""
    problems = check_checkpoint(ckpt_dir)
    if problems or target is None or not Path(target).is_dir():
        return problems, []
    return [], checkpoint_fit_problems(ckpt_dir, target)
