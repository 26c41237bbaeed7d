"""A tolerant pass over a `.jsonl` file that `datasets` refused to load.

`datasets`' json builder fails the whole file on one line that is not valid UTF-8 or not JSON.
`drop_bad_lines` reads the file line by line, counts such lines per reason (`not_utf8`, `not_json`,
`not_an_object`) into a `DataReport`, and writes the good lines to a cache file that is loaded
instead. It runs only after a failed load, so clean files cost nothing extra. Blank lines are
ignored, as `datasets` does. `drop_bad_lines_in_dir` does the same for a directory of `.jsonl`
files (a folder of links to the cleaned and the untouched files, in the same order).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from train.data.report import DataReport
from train.data.rows import BadRowError


def _clean_path(path: Path, suffix: str = ".jsonl") -> Path:
    import datasets

    st = path.stat()
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()
    name = f"{path.stem}-{hashlib.sha256(key).hexdigest()[:16]}{suffix}"
    return Path(datasets.config.HF_DATASETS_CACHE) / "dspark-clean-jsonl" / name


def _problem(raw: bytes) -> tuple[str, str] | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return "not_utf8", str(e)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return "not_json", str(e)
    if not isinstance(value, dict):
        return "not_an_object", f"a JSON {type(value).__name__}, not an object"
    return None


def drop_bad_lines(
    path: str | os.PathLike, report: DataReport, *, strict: bool, max_rows: int | None = None
) -> Path | None:
    """Return a `.jsonl` with only the good lines of `path`, or None if every line is good (the
    load failed for another reason). `strict`: raise BadRowError at the first bad line instead.
    With `max_rows`, stops after that many good lines (the rows training would read)."""
    path = Path(path)
    out = _clean_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp-{os.getpid()}")
    good = bad = 0
    try:
        with open(path, "rb") as f, open(tmp, "wb") as dst:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                problem = _problem(raw)
                if problem is None:
                    dst.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    good += 1
                    if max_rows is not None and good >= max_rows:
                        break
                    continue
                reason, detail = problem
                if strict:
                    raise BadRowError(
                        number - 1,
                        f"{path}:{number} is {reason.replace('_', ' ')} ({detail}); set "
                        "data.on_bad_row=skip to drop such lines",
                        reason,
                    )
                bad += 1
                report.rows += 1  # the good lines are counted when they are rendered
                report.drop(reason, f"line {number}: {detail[:80]}")
        if not bad:
            return None
        os.replace(tmp, out)  # streamed, never held in memory; atomic for concurrent ranks
        return out
    finally:
        tmp.unlink(missing_ok=True)


def drop_bad_lines_in_dir(
    path: str | os.PathLike, report: DataReport, *, strict: bool
) -> Path | None:
    """`drop_bad_lines` for every `.jsonl` under the folder `path`; None if every line is good."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
    cleaned = [drop_bad_lines(f, report, strict=strict) for f in files]
    if all(c is None for c in cleaned):
        return None
    key = "".join(f"{f.resolve()}:{f.stat().st_mtime_ns}" for f in files).encode()
    out = _clean_path(files[0]).parent / f"{path.name}-{hashlib.sha256(key).hexdigest()[:16]}"
    out.mkdir(parents=True, exist_ok=True)
    for i, (f, c) in enumerate(zip(files, cleaned)):
        link = out / f"{i:06d}-{f.name}"
        if not link.exists():
            try:
                link.symlink_to((c or f).resolve())
            except FileExistsError:  # another rank made the same link
                pass
    return out
