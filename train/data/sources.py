"""Load raw rows from a hub id or local files into a `datasets.Dataset`.

Local sources: a `.jsonl`/`.json`/`.parquet`/`.arrow` file (`.jsonl.gz`/`.json.gz` too), a
directory of such files (all of one kind), or a directory written by `Dataset.save_to_disk`.
`NAME:SPLIT[?options]` names a dataset shipped in a pip package (train/data/packaged.py, e.g.
`sharegpt:train`), prepared once into a cache. Anything else that does not exist locally is treated
as a hub id (`datasets.load_dataset`), which needs the hub or its cache.
"""

import os
from pathlib import Path

import datasets

from train.data.packaged import is_packaged, materialize

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


def _kind(path: Path) -> str:
    """The data suffix, looking through a `.gz` (datasets decompresses it)."""
    return Path(path.stem).suffix if path.suffix == ".gz" else path.suffix


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~")) or _kind(Path(source)) in BUILDERS


def _pick_split(obj, split: str | None, source: str) -> datasets.Dataset:
    if isinstance(obj, datasets.Dataset):
        return obj
    split = split or "train"
    if split not in obj:
        raise ValueError(f"{source}: no split {split!r}; available: {sorted(obj)} (data.split=...)")
    return obj[split]


def _local(path: Path, split: str | None, cache_dir: str | None) -> datasets.Dataset:
    if path.is_dir() and ((path / "state.json").exists() or (path / "dataset_dict.json").exists()):
        return _pick_split(datasets.load_from_disk(str(path)), split, str(path))
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if _kind(p) in BUILDERS and p.is_file())
        kinds = {BUILDERS[_kind(p)] for p in files}
        if len(kinds) != 1:
            raise ValueError(
                f"{path}: expected data files of one kind ({sorted(BUILDERS)}), found "
                f"{sorted(kinds) or 'none'}; point data.source at one file or a cleaner directory"
            )
    else:
        files = [path]
        if _kind(path) not in BUILDERS:
            raise ValueError(
                f"{path}: unsupported file type {path.suffix!r}; use {sorted(BUILDERS)}"
            )
    builder = BUILDERS[_kind(files[0])]
    # Local files always land in the builder's single "train" split; `split` may still slice it.
    return datasets.load_dataset(
        builder, data_files=[str(p) for p in files], split=split or "train", cache_dir=cache_dir
    )


def load_rows(
    source: str | os.PathLike,
    split: str | None = None,
    max_rows: int | None = None,
    *,
    name: str | None = None,
    cache_dir: str | None = None,
) -> datasets.Dataset:
    """Return the rows of `source` as a Dataset (first `max_rows` rows if given).

    `split` defaults to "train" and accepts slicing ("train[:1000]"); `name` is the hub config.
    """
    source = os.fspath(source)
    if is_packaged(source):
        source = os.fspath(materialize(source))
    path = Path(source).expanduser()
    if path.exists():
        ds = _local(path, split, cache_dir)
    elif _looks_like_path(source):
        raise FileNotFoundError(f"data source {source!r} does not exist")
    else:
        ds = _pick_split(
            datasets.load_dataset(source, name, split=split or "train", cache_dir=cache_dir),
            split,
            source,
        )
    if max_rows is not None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        ds = ds.select(range(min(max_rows, len(ds))))
    return ds
