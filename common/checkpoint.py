"""Checkpoint I/O in the format vLLM's `dspark` speculator reads (docs/vllm-contract.md).

Canonical (dense) layout, as DeepSeek ships its DSpark drafts:
    config.json         `DSparkConfig.to_hf_dict()` (Qwen3 backbone + DSpark keys, both layout keys)
    model.safetensors   keys = our parameter names (no `model.` prefix); weights in `dtype`
                        (bf16 by default), confidence head fp32, d2t int64 (+ t2d bool) only for a
                        reduced vocab (vLLM has no d2t parameter for a full-vocab draft); only
                        what the draft owns: the target's embedding (and, full vocab, lm_head)
                        are left out and shared by the loader (`shared_with_target`)
    provenance.json     resolved config, command, git SHA, package versions, vocab-count hash
Speculators layout: the same weights; config.json carries `speculators_config` so that
`vllm serve <ckpt>` needs no flags.

Every writer builds the folder in a temp dir next to the destination, validates it with
`common.contract.check_checkpoint` and renames it into place: nothing half-written is ever final.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from common.config import DSparkConfig
from common.model import DSparkDraftModel

CONFIG_NAME, WEIGHTS_NAME, PROVENANCE_NAME = "config.json", "model.safetensors", "provenance.json"
FP32_KEYS_PREFIX = "confidence_head."
PACKAGES = ("torch", "transformers", "accelerate", "datasets", "safetensors", "dspark", "vllm")


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


def is_speculators_config(raw: dict) -> bool:
    return "speculators_config" in raw


def shared_with_target(cfg: DSparkConfig) -> tuple[str, ...]:
    """Keys the draft takes from the target rather than owning: its input embedding always (the
    draft's hidden size is the target's and the table is frozen), and its lm_head when the draft
    vocabulary is the full one (with a reduced vocabulary the lm_head rows are the draft's own).
    vLLM's `load_dspark_model` (0.26-0.34) aliases the target's tensors for missing keys."""
    return TARGET_OWNED if not cfg.reduced_vocab else TARGET_OWNED[:1]


def export_state_dict(
    model: DSparkDraftModel, dtype=torch.bfloat16, include_embed=False, include_lm_head=False
):
    """Tensors exactly as written to model.safetensors: what the draft owns, plus the target's
    embedding / lm_head copies only when `include_embed` / `include_lm_head` ask for them."""
    cfg = model.config
    skip = set(shared_with_target(cfg))
    if include_embed:
        skip.discard("embed_tokens.weight")
    if include_lm_head:
        skip.discard("lm_head.weight")
    out = {}
    for name, t in model.state_dict().items():
        if name in ("d2t", "t2d"):
            if cfg.reduced_vocab:
                out[name] = t.to(torch.int64 if name == "d2t" else torch.bool)
            continue
        if name in skip:
            continue
        out[name] = t.to(torch.float32 if name.startswith(FP32_KEYS_PREFIX) else dtype)
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def git_sha(path: str | os.PathLike = ".") -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return versions


def make_provenance(cfg: DSparkConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "dspark_config": cfg.to_hf_dict(),
        "command": " ".join(sys.argv),
        "git_sha": git_sha(Path(__file__).resolve().parent),
        "packages": package_versions(),
        **(extra or {}),
    }


def verifier_name_or_path(verifier: str | None) -> str:
    """What `verifier.name_or_path` must hold so the checkpoint loads from any directory: the hub
    id of a hub-cache snapshot (`.../models--ORG--NAME/snapshots/SHA`), else the absolute path of
    a local folder, else the string as given (a hub id)."""
    if not verifier:
        return ""
    path = Path(verifier).expanduser()
    if not path.is_dir():
        return verifier
    path = path.resolve()
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name[len("models--") :].replace("--", "/")
    return str(path)


def _verifier_architectures(verifier: str | None) -> list[str]:
    cfg = Path(verifier).expanduser() / CONFIG_NAME if verifier else None
    if cfg is None or not cfg.is_file():
        return []
    try:
        return list(json.loads(cfg.read_text()).get("architectures") or [])
    except (json.JSONDecodeError, AttributeError):
        return []


def speculators_config(cfg: DSparkConfig, verifier: str | None) -> dict[str, Any]:
    """config.json of the speculators layout, as `speculators==0.9.0` validates it
    (`SpeculatorModelConfig.from_pretrained`: DSpark's proposal type is "greedy") and vLLM's
    `update_dspark` reads it (top-level keys; its `sample_from_anchor` default is False, so it is
    always written). `aux_hidden_state_layer_ids` are target_layer_ids + 1 (HF hidden-state
    indices)."""
    hf = cfg.to_hf_dict()
    layer = {k: hf[k] for k in hf if k not in _DSPARK_TOP_LEVEL and k != "architectures"}
    verifier = verifier or cfg.target_name_or_path
    return {
        "architectures": ["Qwen3DSparkModel"],
        "speculators_model_type": "dspark",
        "speculators_version": "0.3.0",
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": cfg.num_speculative_tokens}
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": verifier_name_or_path(verifier),
                "architectures": _verifier_architectures(verifier),
            },
        },
        "transformer_layer_config": layer,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        **{k: hf[k] for k in _DSPARK_TOP_LEVEL if k in hf},
    }


_DSPARK_TOP_LEVEL = (
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


def save_checkpoint(
    model: DSparkDraftModel,
    out_dir: str | os.PathLike,
    *,
    fmt: str = "canonical",
    dtype: torch.dtype = torch.bfloat16,
    include_embed: bool = False,
    include_lm_head: bool = False,
    provenance: dict[str, Any] | None = None,
    verifier: str | None = None,
    overwrite: bool = True,
) -> Path:
    """Write `model` as a vLLM-loadable folder (`fmt` = "canonical" | "speculators").

    Validated before the rename into `out_dir`; raises `ValueError` listing every problem.
    """
    from common.contract import check_checkpoint  # local: contract imports this module

    cfg = model.config
    if fmt == "canonical":
        config = cfg.to_hf_dict()
    elif fmt == "speculators":
        config = speculators_config(cfg, verifier)
    else:
        raise ValueError(f"fmt={fmt!r}: choose 'canonical' or 'speculators'")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True or choose another directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        tensors = export_state_dict(model, dtype, include_embed, include_lm_head)
        tensors = {layout_key(k, fmt == "speculators"): v for k, v in tensors.items()}
        save_file(tensors, str(tmp / WEIGHTS_NAME))
        prov = make_provenance(cfg, provenance)
        (tmp / PROVENANCE_NAME).write_text(json.dumps(prov, indent=2, default=str) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)  # world-readable: a server or hub client may run as another user
        problems = check_checkpoint(tmp)
        if problems:
            raise ValueError("refusing to write an invalid checkpoint:\n  " + "\n  ".join(problems))
        tmp.chmod(0o755)  # mkdtemp made it 0700: a server running as another user can't read it
        _replace_dir(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def _replace_dir(new: Path, out: Path) -> None:
    """Rename `new` to `out`; an existing `out` is moved aside first and put back if the final
    rename fails, so a failed write still leaves the old checkpoint at `out`."""
    if not out.exists():
        new.rename(out)
        return
    trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))  # unique per call
    old = trash / out.name
    try:
        out.rename(old)
        try:
            new.rename(out)
        except BaseException:
            old.rename(out)
            raise
    except BaseException:
        if not any(trash.iterdir()):
            trash.rmdir()
        raise
    shutil.rmtree(trash)


def read_config(ckpt_dir: str | os.PathLike) -> DSparkConfig:
    """DSparkConfig from either layout's config.json."""
    d = json.loads((Path(ckpt_dir) / CONFIG_NAME).read_text())
    if is_speculators_config(d):
        d = _flatten_speculators(d)
    return DSparkConfig.from_hf_dict(d)


def _flatten_speculators(d: dict[str, Any]) -> dict[str, Any]:
    """The flat DSpark dict of a speculators-layout config.json, ours or one `speculators`
    wrote (which has no target_layer_ids / target_num_hidden_layers, may write
    `target_hidden_size: null`, and keeps rope_theta only under rope_parameters)."""
    flat = dict(d.get("transformer_layer_config") or {})
    flat.update({k: d[k] for k in _DSPARK_TOP_LEVEL if d.get(k) is not None})
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


def load_checkpoint(
    ckpt_dir: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    target_embed: torch.Tensor | None = None,
    target_lm_head: torch.Tensor | None = None,
) -> DSparkDraftModel:
    """Load either layout into a DSparkDraftModel. Keys the export left to the target
    (`shared_with_target`: embed_tokens, and lm_head with the full vocabulary) are filled from
    `target_embed` / `target_lm_head` ([V, H], the target's tables), as vLLM's loader does."""
    cfg = read_config(ckpt_dir)
    spec = is_speculators_config(json.loads((Path(ckpt_dir) / CONFIG_NAME).read_text()))
    tensors = load_file(str(Path(ckpt_dir) / WEIGHTS_NAME))
    tensors = {layout_key(k, spec, to_ours=True): v for k, v in tensors.items()}
    given = {"embed_tokens.weight": target_embed, "lm_head.weight": target_lm_head}
    for key in shared_with_target(cfg):
        if key in tensors:
            continue
        if given[key] is None:
            arg = "target_embed" if key.startswith("embed") else "target_lm_head"
            raise ValueError(
                f"{ckpt_dir} has no {key} (it shares the target's): pass {arg} (the target's "
                f"{'input embedding' if arg == 'target_embed' else 'lm_head'}) to load it"
            )
        tensors[key] = given[key]
    model = DSparkDraftModel(cfg)
    if not cfg.reduced_vocab:
        tensors.setdefault("d2t", model.d2t)
        tensors.setdefault("t2d", model.t2d)
    elif "t2d" not in tensors:
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(cfg.draft_vocab) + tensors["d2t"]] = True
        tensors["t2d"] = t2d
    model.load_state_dict(tensors, strict=True)
    model.to(device)
    for name, p in model.named_parameters():
        if not name.startswith(FP32_KEYS_PREFIX):
            p.data = p.data.to(dtype)
    return model
