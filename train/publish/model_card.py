"""Model card (`README.md`) for an exported DSpark checkpoint.

Design choices:
- Everything about the draft is read back from the checkpoint's own config.json (`read_config`),
  so the card cannot disagree with what vLLM will load; the caller only supplies what the folder
  does not hold (target, recipe, metrics, per-position acceptance).
- Deterministic: no timestamps, no host names; the same inputs give byte-identical output, so
  re-exporting an unchanged draft makes an empty Hub commit that `upload_folder` skips.
- The vLLM command's `--speculative-config` is `common.spec_config.speculative_config`, the one
  `serve.launch` runs and `serve.check` prints: the card shows the launcher's default launch.
- Front matter values are written as JSON scalars (valid YAML), so no YAML writer is needed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.atomic_file import write_whole
from common.checkpoint import PROVENANCE_NAME, read_config
from common.config import VLLM_MARKOV_HEAD_TYPES, DSparkConfig
from common.spec_config import speculative_config

CARD_NAME = "README.md"
TAGS = ("dspark", "speculative-decoding", "vllm")
# A Hub repo id (`org/name`), the only thing `base_model` may hold; a local path is not one.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def vllm_command(cfg: DSparkConfig, target: str, model: str) -> str:
    spec = json.dumps(speculative_config(cfg, model))
    return f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(spec)}"


def launch_commands(target: str, model: str, repo_id: str | None) -> list[str]:
    """serve.launch takes a local checkpoint folder: a Hub draft is downloaded first."""
    cmds = []
    if repo_id:
        model = repo_id.rsplit("/", 1)[-1]
        cmds.append(f"hf download {shlex.quote(repo_id)} --local-dir {shlex.quote(model)}")
    args = (shlex.quote(f"target={target}"), shlex.quote(f"checkpoint={model}"))
    return [*cmds, "python -m serve.launch " + " ".join(args)]


def write_model_card(
    ckpt_dir: str | os.PathLike,
    *,
    target: str,
    recipe: Mapping[str, Any],
    metrics: Mapping[str, Any],
    per_position_acceptance: list[float],
    repo_id: str | None = None,
    local_path: str | os.PathLike | None = None,
) -> Path:
    """Write `ckpt_dir/README.md` and return its path.

    `per_position_acceptance[k]` is the conditional acceptance (1 - TV) of draft k given drafts
    0..k-1 were accepted (docs/dspark.md): one value per speculative token, or empty if not
    measured. `repo_id` names the model in the launch commands; without it the folder's absolute
    path is used (`local_path` when the card is written into a temp folder before its rename).
    """
    ckpt = Path(ckpt_dir)
    cfg = read_config(ckpt)
    acc = [float(a) for a in per_position_acceptance]
    bad = [a for a in acc if not (0.0 <= a <= 1.0)]  # also catches NaN
    if bad:
        raise ValueError(f"per_position_acceptance must lie in [0, 1]; got {bad}")
    if acc and len(acc) != cfg.num_speculative_tokens:
        raise ValueError(
            f"per_position_acceptance has {len(acc)} values but the checkpoint drafts "
            f"{cfg.num_speculative_tokens} tokens per block ({_layout(cfg)}): pass one value per "
            "draft position"
        )
    text = render_model_card(
        cfg,
        target=target,
        repo_id=repo_id,
        local_path=str(Path(local_path or ckpt).resolve()),
        recipe=recipe,
        metrics=metrics,
        per_position_acceptance=acc,
        provenance=_read_provenance(ckpt),
    )
    return write_whole(ckpt / CARD_NAME, text)  # never half a card in a folder that may be pushed


def render_model_card(
    cfg: DSparkConfig,
    *,
    target: str,
    repo_id: str | None,
    local_path: str,
    recipe: Mapping[str, Any],
    metrics: Mapping[str, Any],
    per_position_acceptance: list[float],
    provenance: Mapping[str, Any] | None = None,
) -> str:
    n = cfg.num_speculative_tokens
    model = repo_id or local_path
    lines = ["---", "library_name: vllm"]
    if _REPO_ID.match(target):
        lines.append(f"base_model: {json.dumps(target)}")
    lines += ["tags:", *(f"- {t}" for t in TAGS), "---", ""]

    name = model.rstrip("/").rsplit("/", 1)[-1]
    lines += [
        f"# {name}",
        "",
        f"A DSpark speculative-decoding draft for `{target}`: a small block-parallel drafter that "
        "reads the target's hidden states and proposes several tokens per step, which the target "
        "verifies losslessly. It is served by vLLM's `dspark` speculative method.",
        "",
        "## The draft",
        "",
        *_table(("Property", "Value"), _draft_rows(cfg, (provenance or {}).get("mask_token"))),
        "",
        "## Use it with vLLM",
        "",
        "```bash",
        vllm_command(cfg, target, model),
        "```",
        "",
        f"- `num_speculative_tokens` is {n} ({_layout(cfg)}); always pass it: vLLM defaults it "
        "to `block_size` whatever the layout.",
    ]
    if cfg.enable_confidence_head:
        lines.append(
            "- Adaptive verification uses the confidence head: add "
            '`"enable_adaptive_verification": true` (`adaptive_verification=true` in '
            "`serve.launch`; vLLM >= 0.28). It needs full CUDA graphs (no `--enforce-eager`), "
            "no LoRA and pipeline parallel size 1."
        )
    lines.append(
        "- With tensor parallelism add `-tp N --enable-batch-sharded-sampling` "
        "(needs `max_num_seqs >= N`)."
    )
    if cfg.markov_head_type not in VLLM_MARKOV_HEAD_TYPES:
        lines.append(
            f"- **Note:** the `{cfg.markov_head_type}` Markov head is not served by stock vLLM "
            f"(it builds {' / '.join(VLLM_MARKOV_HEAD_TYPES)}): serve it with a vLLM model plugin "
            "or this repository's embedded engine."
        )
    lines += [
        "",
        "With this repository (dspark):",
        "",
        "```bash",
        *launch_commands(target, model, repo_id),
        "```",
        "",
        "## Training recipe",
        "",
        *(_table(("Setting", "Value"), _flat_rows(recipe)) if recipe else ["Not recorded."]),
        "",
        "## Metrics",
        "",
        *(_table(("Metric", "Value"), _flat_rows(metrics)) if metrics else ["Not recorded."]),
        "",
        "## Per-position acceptance",
        "",
    ]
    if per_position_acceptance:
        survival, tau, rows = 1.0, 1.0, []
        for k, a in enumerate(per_position_acceptance):
            survival *= a
            tau += survival  # analytic tau: 1 + sum_k prod_{i<=k} a_i
            rows.append((str(k + 1), _fmt(a), _fmt(survival)))
        lines += [
            "Acceptance of draft position k given the positions before it were accepted "
            "(1 - TV against the target), and the probability that positions 1..k are all "
            "accepted.",
            "",
            *_table(("Position", "Acceptance", "Accepted through k"), rows),
            "",
            f"Implied mean acceptance length (incl. the bonus token): {_fmt(tau)}.",
        ]
        source = ((provenance or {}).get("expected_acceptance") or {}).get("source")
        if source:
            lines += [
                "",
                f"Measured on the {source}. These numbers are recorded in `{PROVENANCE_NAME}` "
                "(`expected_acceptance`); the serving watchdog warns when the live acceptance "
                "falls far below them.",
            ]
    else:
        lines.append("Not measured.")
    lines += ["", "## Provenance", ""]
    prov = provenance or {}
    if prov.get("git_sha"):
        lines.append(f"Exported from dspark commit `{prov['git_sha']}`; see `{PROVENANCE_NAME}`.")
    else:
        lines.append(f"See `{PROVENANCE_NAME}` (resolved config, command, package versions).")
    return "\n".join(lines) + "\n"


def _layout(cfg: DSparkConfig) -> str:
    if cfg.sample_from_anchor:
        return f"anchor-first: {cfg.block_size} drafts per block of {cfg.block_size}"
    return f"1+N (bonus anchor): {cfg.block_size - 1} drafts per block of {cfg.block_size}"


def _draft_rows(cfg: DSparkConfig, mask: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    if cfg.has_markov:
        markov = f"{cfg.markov_head_type}, rank {cfg.markov_rank}"
    else:
        markov = "none (DFlash)"
    if cfg.enable_confidence_head:
        inputs = "hidden + Markov embedding" if cfg.confidence_head_with_markov else "hidden"
        conf = f"yes ({inputs})"
    else:
        conf = "no"
    if cfg.reduced_vocab:
        vocab = f"{cfg.draft_vocab} of {cfg.vocab_size} target tokens (d2t map ships)"
    else:
        vocab = f"full target vocab ({cfg.vocab_size})"
    rows = [
        ("Layout", _layout(cfg)),
        ("Block size", str(cfg.block_size)),
        ("Speculative tokens", str(cfg.num_speculative_tokens)),
        ("Markov head", markov),
        ("Confidence head", conf),
        ("Draft vocab", vocab),
        ("Draft layers", str(cfg.num_hidden_layers)),
        ("Hidden size", str(cfg.hidden_size)),
        ("Target layers read", ", ".join(map(str, cfg.target_layer_ids))),
        ("Mask token id", str(cfg.mask_token_id)),
    ]
    if (
        mask and mask.get("id") == cfg.mask_token_id
    ):  # how setup chose it (train/init/mask_token.py)
        token = f"`{mask['token']}`, " if mask.get("token") is not None else ""
        rows[-1] = ("Mask token id", f"{cfg.mask_token_id} ({token}{mask.get('how', '')})")
    if cfg.dspark_draft_topk is not None:
        rows.append(("Draft top-k", str(cfg.dspark_draft_topk)))
    return rows


def _flat_rows(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts become dotted keys, in the caller's order."""
    rows = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            rows += _flat_rows(v, f"{key}.")
        else:
            rows.append((key, _fmt(v)))
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list | tuple):
        return ", ".join(_fmt(x) for x in v)
    return str(v)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    def row(cells):
        cells = (str(c).replace("|", "\\|").replace("\n", " ") for c in cells)
        return "| " + " | ".join(cells) + " |"

    return [row(header), "|" + "|".join("---" for _ in header) + "|", *(row(r) for r in rows)]


def _read_provenance(ckpt: Path) -> dict[str, Any]:
    try:
        return json.loads((ckpt / PROVENANCE_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
