"""A run's training and held-out splits: rows read, bad lines and rows dropped and counted, packed.
Every check that can fail does so here, before anything is written."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from train.data import build_dataset, load_rows
from train.data.heldout import AUTO, HELDOUT_FRACTION, carve_heldout, target_heldout_path
from train.data.jsonl import drop_bad_lines, drop_bad_lines_in_dir
from train.data.report import BadDataShare, DataReport
from train.errors import SetupError


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
            num_proc=dcfg.get(
                "num_proc"
            ),  # optional: train.publish.calibrate builds a partial config
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
        with _json_loader_quiet(jsonl):  # its error for a bad line is ours to summarise
            return load_rows(path, split=dcfg.split, max_rows=max_rows)
    except FileNotFoundError as e:
        raise SetupError(f"cannot read dataset {path!r}: {type(e).__name__} {e}") from e
    except Exception as e:  # datasets raises several kinds for one bad line (StopIteration: all)
        if not jsonl:
            if isinstance(e, StopIteration):
                raise SetupError(f"cannot read dataset {path!r}: it yields no rows") from e
            raise
        failure = e
    # One line that is not UTF-8 or not JSON fails datasets' whole file: drop and count such lines.
    strict = dcfg.on_bad_row == "error"
    if jsonl_dir:
        clean = drop_bad_lines_in_dir(path, report, strict=strict)
    else:
        clean = drop_bad_lines(path, report, strict=strict, max_rows=max_rows)
    if clean is not None and not _has_lines(clean):
        detail = "; ".join(line.strip() for line in report.lines()[1:])
        raise SetupError(f"{path}: no usable rows out of {report.rows}: {detail}")
    try:
        if clean is None:
            raise failure
        report.source = f"{path} (row numbers below count the lines that parsed)"
        return load_rows(clean, split=dcfg.split, max_rows=max_rows)
    except Exception as e:  # not a bad line: e.g. a field whose type differs between rows
        cause = e.__cause__ or e
        raise SetupError(f"cannot read dataset {path!r}: {type(cause).__name__}: {cause}") from e


def _has_lines(clean: Path) -> bool:
    """Whether the cleaned file (or any file the cleaned folder links to) kept a line."""
    files = sorted(clean.iterdir()) if clean.is_dir() else [clean]
    return any(f.resolve().stat().st_size > 0 for f in files)


@contextlib.contextmanager
def _json_loader_quiet(quiet: bool):
    """Silence datasets' json loader's own error log (a pyarrow message per failed file) while a
    .jsonl is first tried: a bad line is then dropped and counted in the data report instead."""
    log = logging.getLogger("datasets.packaged_modules.json.json")
    level = log.level
    if quiet:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)
