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
`vllm serve <ckpt>` needs no flags (vLLM 0.34: only when the verifier is a Hub id, not a local
folder; docs/vllm-contract.md).

Every writer builds the folder in a temp dir next to the destination, validates it with
`common.contract.check_checkpoint` and renames it into place: nothing half-written is ever final.
A write that fails at any call (disk full, `OSError`, kill) leaves the previous folder as it was;
free space is checked first (`check_free_space`) so a save that cannot fit is refused up front.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from common.checkpoint_errors import check_safetensors_file, read_json_file
from common.checkpoint_files import (  # re-exported: the names every reader imports from here
    CONFIG_NAME,
    DSPARK_TOP_LEVEL_KEYS,
    FP32_KEYS_PREFIX,
    PROVENANCE_NAME,
    WEIGHTS_NAME,
    is_speculators_config,
    layout_key,
    read_config,
    shared_with_target,
)
from common.config import DSparkConfig
from common.contract import check_checkpoint
from common.model import DSparkDraftModel

# Free space demanded beyond the expected bytes of a save: a fraction of it plus a fixed floor
# (filesystem blocks, metadata, the JSON files).
FREE_SPACE_MARGIN, FREE_SPACE_FLOOR = 0.10, 16 << 20
PACKAGES = ("torch", "transformers", "accelerate", "datasets", "safetensors", "dspark", "vllm")


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


class NoSpaceForSave(OSError):
    """A save refused before writing anything because the disk cannot hold it."""


def check_free_space(where: str | os.PathLike, need_bytes: int, what: str) -> None:
    """Refuse (`NoSpaceForSave`, with the sizes) a write of `need_bytes` into `where` when the
    filesystem has less free than that plus the margin."""
    want = int(need_bytes * (1 + FREE_SPACE_MARGIN)) + FREE_SPACE_FLOOR
    free = shutil.disk_usage(where).free
    if free < want:
        mib = 1 << 20
        raise NoSpaceForSave(
            f"not enough free space for {what}: it needs about {need_bytes / mib:.1f} MiB "
            f"({want / mib:.1f} MiB with the safety margin) but {where} has "
            f"{free / mib:.1f} MiB free. Free some space (or lower trainer.keep_last), or write "
            "elsewhere (output_dir)."
        )


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
    layer = {k: hf[k] for k in hf if k not in DSPARK_TOP_LEVEL_KEYS and k != "architectures"}
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
        **{k: hf[k] for k in DSPARK_TOP_LEVEL_KEYS if k in hf},
    }


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
    before_publish: Callable[[Path], None] | None = None,
) -> Path:
    """Write `model` as a vLLM-loadable folder (`fmt` = "canonical" | "speculators").

    Validated before the rename into `out_dir`; raises `ValueError` listing every problem.
    `before_publish(tmp_dir)` adds files (e.g. the model card) to the folder before the rename, so
    they appear together with the weights or not at all.
    """
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
    tensors = export_state_dict(model, dtype, include_embed, include_lm_head)
    tensors = {layout_key(k, fmt == "speculators"): v for k, v in tensors.items()}
    need = sum(t.numel() * t.element_size() for t in tensors.values())
    check_free_space(out.parent, need, f"checkpoint {out}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / WEIGHTS_NAME))
        prov = make_provenance(cfg, provenance)
        (tmp / PROVENANCE_NAME).write_text(json.dumps(prov, indent=2, default=str) + "\n")
        problems = check_checkpoint(tmp)
        if problems:
            raise ValueError("refusing to write an invalid checkpoint:\n  " + "\n  ".join(problems))
        if before_publish is not None:
            before_publish(tmp)
        for f in tmp.iterdir():  # the card too: a server or hub client may run as another user
            f.chmod(0o644)
        tmp.chmod(0o755)  # mkdtemp made it 0700: a server running as another user can't read it
        replace_dir(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def replace_dir(new: Path, out: Path) -> None:
    """Put folder `new` at `out`. An existing `out` is swapped atomically with `new` where the
    filesystem allows it (Linux `renameat2(RENAME_EXCHANGE)`; `new` then holds the old folder and
    is deleted), so no instant exists, even under kill -9, at which `out` is missing. Elsewhere
    `out` is moved aside first and put back if the second rename fails."""
    if not out.exists():
        new.rename(out)
        return
    if _exchange_dirs(new, out):
        shutil.rmtree(new, ignore_errors=True)
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


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _exchange_dirs(a: Path, b: Path) -> bool:
    """Atomically swap two paths; False where the OS or filesystem cannot (then nothing moved)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


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
    `target_embed` / `target_lm_head` ([V, H], the target's tables), as vLLM's loader does.
    A missing, non-JSON or truncated file is a `CheckpointFileError` naming it."""
    cfg = read_config(ckpt_dir)
    spec = is_speculators_config(read_json_file(Path(ckpt_dir) / CONFIG_NAME))
    check_safetensors_file(Path(ckpt_dir) / WEIGHTS_NAME)  # one line, not a Rust traceback
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
