"""Build what a distillation run needs from its config: the frozen target, the draft config, the
datasets and the vocab map. Every check that can fail does so here, before anything is written."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.config import DSparkConfig
from common.target import decoder_layers
from common.vocab import VocabMap, build_vocab_map, counts_hash
from train.data import build_dataset, count_loss_tokens, load_rows
from train.data.heldout import AUTO, HELDOUT_FRACTION, carve_heldout, target_heldout_path
from train.data.jsonl import drop_bad_lines, drop_bad_lines_in_dir
from train.data.report import BadDataShare, DataReport
from train.mask_token import MaskTokenError, choose_mask_token
from train.schema import DraftCfg

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# DraftCfg keys the mask choice resolves (train/mask_token.py); the others copy to DSparkConfig
MASK_KEYS = ("mask_token", "mask_token_id")


class SetupError(RuntimeError):
    """A run that cannot start; the message says what to change."""


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def ensure_target(tcfg) -> None:
    """Build the target at `path` if it is missing and the config says how: `prepare` names a
    real model (train/prepare_target.py), `build_tiny` the embedded tiny target."""
    if Path(tcfg.path).exists():
        return
    name = tcfg.get("prepare")
    if name:
        from train.prepare_target import PrepareError, prepare

        print(
            f"[distill] target {tcfg.path} is missing: preparing it "
            f"(python -m train.prepare_target {name} --out {tcfg.path})"
        )
        try:
            prepare(name, tcfg.path)
        except PrepareError as e:
            raise SetupError(f"target.prepare={name!r}: {e}") from e
        return
    if not tcfg.build_tiny:
        return
    from train.tiny_target.build import build_tiny_target

    print(f"[distill] building the tiny target at {tcfg.path} (~{tcfg.tiny_minutes} min)")
    build_tiny_target(tcfg.path, minutes=tcfg.tiny_minutes)


def load_target(tcfg, device: torch.device):
    """-> (frozen model in eval mode, tokenizer)."""
    ensure_target(tcfg)
    try:
        tok = AutoTokenizer.from_pretrained(tcfg.path, trust_remote_code=tcfg.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            tcfg.path,
            dtype=resolve_dtype(tcfg.dtype, device),
            trust_remote_code=tcfg.trust_remote_code,
        )
    except OSError as e:
        raise SetupError(
            f"cannot load target {tcfg.path!r}: {e}. Give target.path a local HF model folder "
            "(no hub access here) or set target.build_tiny=true for the embedded tiny target."
        ) from e
    model.requires_grad_(False).eval().to(device)
    vocab = model.config.get_text_config().vocab_size
    if len(tok) > vocab:
        raise SetupError(
            f"tokenizer has {len(tok)} tokens but the target's vocab_size is {vocab}: "
            "the tokenizer does not belong to this target"
        )
    return model, tok


def apply_speed_settings(tcfg, draft, target, device: torch.device) -> None:
    """`trainer.draft_attention`, `trainer.target_attention`, `trainer.compile_draft` and
    `trainer.compile_target` onto the models before training; `trainer.compile_loss` is applied
    by `DistillObjective` and only checked here. GPU only: there is no flex-attention backward
    on the CPU, and compiling was measured only on the GPU
    (scripts/bench_train_scale.py, docs/benchmarks.md "The trainer at Qwen3-8B shape"). A target
    left on flex by an earlier call goes back to sdpa."""
    attention = {k: tcfg.get(k, "sdpa") for k in ("draft_attention", "target_attention")}
    compiled = {
        k: bool(tcfg.get(k, False)) for k in ("compile_draft", "compile_target", "compile_loss")
    }
    gpu_only = [f"trainer.{k}=flex" for k, v in attention.items() if v == "flex"]
    gpu_only += [f"trainer.{k}=true" for k, v in compiled.items() if v]
    if device.type != "cuda" and gpu_only:
        raise SetupError(
            f"{', '.join(gpu_only)}: GPU only, and this run trains on {device.type}; leave "
            "them at their defaults (sdpa, false) there"
        )
    draft.train_attention = attention["draft_attention"]
    if attention["target_attention"] == "flex":
        target.set_attn_implementation("flex_attention")
    elif getattr(target.config, "_attn_implementation", None) == "flex_attention":
        target.set_attn_implementation("sdpa")
    if compiled["compile_draft"]:
        for layer in draft.layers:
            layer.compile()
    # The target's layers before TargetCapture hooks them (a compiled call runs the hooks).
    for layer in decoder_layers(target):
        if compiled["compile_target"]:
            layer.compile()
        else:  # undo an earlier call's (nn.Module.compile keeps the compiled call here)
            layer._compiled_call_impl = None


def draft_config(dcfg, target_model, tokenizer, target_path: str, mask=None) -> DSparkConfig:
    """The draft's DSparkConfig. `mask`: the `MaskToken` from `choose_mask_token` (which checks
    the training data); without it one is chosen from the tokenizer alone."""
    if mask is None:
        vocab = target_model.config.get_text_config().vocab_size
        try:
            mask = choose_mask_token(dcfg, tokenizer, vocab)
        except MaskTokenError as e:
            raise SetupError(str(e)) from None
    mask_id = mask.id
    choices = {
        f.name: dcfg[f.name] for f in dataclasses.fields(DraftCfg) if f.name not in MASK_KEYS
    }
    choices["target_layer_ids"] = (
        list(choices["target_layer_ids"]) if choices["target_layer_ids"] is not None else None
    )
    hf = target_model.config.get_text_config().to_dict()
    hf["_name_or_path"] = target_path
    return DSparkConfig.from_target(hf, mask_token_id=int(mask_id), **choices)


def mask_token_for(dcfg, target_model, tokenizer, train_ds):
    """Choose (or check) the mask token against the training rows, print the choice and why."""
    vocab = target_model.config.get_text_config().vocab_size
    try:
        mask = choose_mask_token(dcfg, tokenizer, vocab, train_ds)
    except MaskTokenError as e:
        raise SetupError(str(e)) from None
    print(f"[distill] mask token: {mask.describe()}")
    return mask


def build_split(dcfg, path: str, tokenizer, seed: int, max_rows=None):
    """Rows of `path` -> packed training rows. Bad rows are dropped and counted per reason
    (`data.on_bad_row=skip`) or stop the run (`error`); the counts are printed at the end of the
    data pass, and a dropped share above `data.max_bad_row_share` stops the run here."""
    rows, report = _open_split(dcfg, path, max_rows)
    return _pack(dcfg, rows, path, tokenizer, seed, report)


def build_splits(cfg, train_path: str, tokenizer):
    """-> (packed training rows, packed held-out rows or None). `data.heldout`: a source, null (no
    held-out evaluation), or auto: TARGET/data/heldout.jsonl, else a fixed 2% of the training rows
    (train/data/heldout.py)."""
    d, seed = cfg.data, cfg.seed
    heldout = d.heldout
    if heldout == AUTO:
        heldout = str(target_heldout_path(cfg.target.path))
        if not Path(heldout).exists():
            return _carve_heldout_split(d, train_path, tokenizer, seed, heldout)
    train = build_split(d, train_path, tokenizer, seed, d.max_rows)
    held = build_split(d, heldout, tokenizer, seed, d.heldout_max_rows) if heldout else None
    return train, held


def _carve_heldout_split(d, train_path: str, tokenizer, seed: int, looked: str):
    rows, report = _open_split(d, train_path, d.max_rows)
    train_rows, held_rows = carve_heldout(rows, d.heldout_max_rows)
    share = f"{HELDOUT_FRACTION:.0%}"
    note = f"[distill] data.heldout=auto: no {looked}"
    if held_rows is None:
        print(f"{note}, and {train_path} has too few rows to hold {share} out: no held-out eval")
    else:
        print(
            f"{note}: holding out {len(held_rows)} rows of {train_path} instead ({share} by row "
            "hash, never trained on; data.heldout=FILE gives another set)"
        )
        held_report = DataReport(f"{train_path} (held-out part)")
        held_rows = _pack(d, held_rows, train_path, tokenizer, seed, held_report)
    return _pack(d, train_rows, train_path, tokenizer, seed, report), held_rows


def _open_split(dcfg, path: str, max_rows) -> tuple:
    """-> (the rows of `path`, its DataReport so far: unparseable lines)."""
    if Path(path).is_file() and Path(path).stat().st_size == 0:
        raise SetupError(f"dataset {path!r} is empty")
    _bad_row_share(dcfg)  # a bad setting stops the run before the data is read
    report = DataReport(str(path))
    return _load_split(dcfg, path, max_rows, report), report


def _bad_row_share(dcfg) -> float:
    share = float(dcfg.get("max_bad_row_share", 0.05))
    if not 0.0 <= share <= 1.0:
        raise SetupError(f"data.max_bad_row_share={share} must lie in [0, 1]")
    return share


def _pack(dcfg, rows, path: str, tokenizer, seed: int, report: DataReport):
    """Loaded rows -> packed rows; prints the data pass's counts and applies the bad-row gate."""
    share = _bad_row_share(dcfg)
    if len(rows) == 0:
        raise SetupError(f"dataset {path!r} has no rows")
    try:
        ds = build_dataset(
            rows,
            tokenizer,
            dcfg.seq_len,
            packing=dcfg.packing,
            seed=seed,
            chat_template=dcfg.chat_template,
            template_kwargs=dict(dcfg.get("chat_template_kwargs") or {}),
            on_bad_row=dcfg.on_bad_row,
            num_proc=dcfg.get("num_proc"),  # optional: train.calibrate builds a partial config
            report=report,
        )
        for line in report.lines():
            print(f"[data] {line}")
        report.check(share)
    except BadDataShare as e:
        raise SetupError(str(e)) from None
    return ds


def _load_split(dcfg, path: str, max_rows, report: DataReport):
    src = Path(path)
    jsonl_dir = src.is_dir() and any(src.rglob("*.jsonl")) and not (src / "state.json").exists()
    jsonl = (src.is_file() and src.suffix == ".jsonl") or jsonl_dir
    try:
        return load_rows(path, split=dcfg.split, max_rows=max_rows)
    except (FileNotFoundError, StopIteration) as e:
        raise SetupError(f"cannot read dataset {path!r}: {type(e).__name__} {e}") from e
    except Exception as e:  # datasets raises several kinds for one bad line
        if not jsonl:
            raise
        failure = e
    # One line that is not UTF-8 or not JSON fails datasets' whole file: drop and count such lines.
    strict = dcfg.on_bad_row == "error"
    if jsonl_dir:
        clean = drop_bad_lines_in_dir(path, report, strict=strict)
    else:
        clean = drop_bad_lines(path, report, strict=strict, max_rows=max_rows)
    try:
        if clean is None:
            raise failure
        report.source = f"{path} (row numbers below count the lines that parsed)"
        return load_rows(clean, split=dcfg.split, max_rows=max_rows)
    except Exception as e:  # not a bad line: e.g. a field whose type differs between rows
        cause = e.__cause__ or e
        raise SetupError(f"cannot read dataset {path!r}: {type(cause).__name__}: {cause}") from e


REGENERATED_NAME = "regenerated.jsonl"


def regenerate_train_rows(cfg, target_model, tokenizer, out: Path) -> None:
    """Optional step 2: the target answers the training prompts itself, into a resumable JSONL
    (OUTPUT/regenerated.jsonl, sampling parameters stored per row) that training then reads."""
    rcfg = cfg.data.regenerate
    from train.data.regenerate import regenerate_responses

    rows = load_rows(cfg.data.train, split=cfg.data.split, max_rows=cfg.data.max_rows)
    dest = out / REGENERATED_NAME
    sampling = {
        "temperature": rcfg.temperature,
        "top_p": rcfg.top_p,
        "max_new_tokens": rcfg.max_new_tokens,
        "seed": cfg.seed,
    }
    # vLLM loads the target itself from its path; HF reuses the already loaded model.
    model = cfg.target.path if rcfg.backend == "vllm" else target_model
    n = regenerate_responses(
        rows,
        model,
        tokenizer,
        sampling,
        dest,
        rcfg.batch_size,
        backend=rcfg.backend,
        on_bad_row=cfg.data.on_bad_row,
    )
    from train.data.regenerate import summarize_regenerated

    summary = {**summarize_regenerated(dest, tokenizer), "source": cfg.data.train}
    Path(f"{dest}.summary.json").write_text(json.dumps(summary, indent=2))
    print(f"[distill] regenerated {n} responses into {dest}")


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
