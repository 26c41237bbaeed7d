"""One error type for a model folder that cannot be read: `CheckpointFileError`.

Raised by the readers of a draft checkpoint (`common.checkpoint.load_checkpoint`,
`common.checkpoint_files.read_config`) and by `check_model_folder` for a target folder; the
commands (`serve.check`, `serve.launch`, `train.publish.push`, `train.distill`) print its message
as one line. Its message names the file and what is wrong with it: missing, not JSON, or a
safetensors file whose size differs from what its own header promises (a truncated download or
copy), with both sizes.

Design choice: a safetensors file is checked from its header alone (8 bytes of length, a JSON
header, then the tensors' bytes at the offsets the header lists), so checking a 16 GB target costs
a few KB of reads, and a truncated file is caught before any loader fails inside Rust with a
traceback.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

# What makes a Hugging Face model folder loadable: a config, weights in one of these forms, and a
# tokenizer in one of these forms (fast tokenizer.json, sentencepiece, or BPE vocab + merges).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
# Also a tokenizer, less common (WordPiece, other sentencepiece names, tiktoken-based remote code).
OTHER_TOKENIZER_FILES = ("vocab.txt", "spiece.model")


class CheckpointFileError(ValueError):
    """A model folder or one of its files cannot be read; the message names the file and says what
    is wrong (one line)."""


def check_safetensors_file(path: str | os.PathLike) -> None:
    """Raise CheckpointFileError unless `path` is a whole safetensors file: its header parses and
    its size is exactly what the header's tensor offsets say."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointFileError(f"{path} is missing")
    actual = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointFileError(
                f"{path} is not a safetensors file: {actual} bytes, shorter than its 8-byte header "
                "length (truncated or corrupt: copy or download it again)"
            )
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > actual:
            raise CheckpointFileError(
                f"{path} is truncated or corrupt: its header alone says {8 + header_len} bytes, "
                f"the file has {actual} (copy or download it again)"
            )
        try:
            header = json.loads(f.read(header_len))
            end = max(
                (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                default=0,
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise CheckpointFileError(
                f"{path} is not a valid safetensors file: its header does not parse ({e}); copy "
                "or download it again"
            ) from None
    expected = 8 + header_len + end
    if actual != expected:
        what = "truncated" if actual < expected else "corrupt (longer than its header says)"
        raise CheckpointFileError(
            f"{path} is {what}: expected {expected} bytes (from its safetensors header), found "
            f"{actual}; copy or download it again"
        )


def read_json_file(path: str | os.PathLike) -> dict:
    """A JSON object from `path`, or CheckpointFileError naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointFileError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointFileError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointFileError(f"{path} holds a {type(data).__name__}, not a JSON object")
    return data


def check_model_folder(path: str | os.PathLike, what: str = "model") -> None:
    """Raise CheckpointFileError unless local folder `path` holds a Hugging Face model: config.json,
    weights, a tokenizer, and whole safetensors files (the message names what is missing or
    broken). `what` names the folder's role in the message ("target")."""
    path = Path(path)
    files = {p.name for p in path.iterdir()} if path.is_dir() else set()
    missing = []
    if "config.json" not in files:
        missing.append("config.json")
    if not files & set(WEIGHT_FILES) and not any(n.endswith(".safetensors") for n in files):
        missing.append(f"weights ({' or '.join(WEIGHT_FILES[::2])})")
    tiktoken = any(n.endswith(".tiktoken") for n in files)
    if not files & {*TOKENIZER_FILES, *OTHER_TOKENIZER_FILES} and not tiktoken:
        missing.append(f"a tokenizer ({' or '.join(TOKENIZER_FILES)})")
    if missing:
        state = "is empty" if not files else "is incomplete"
        raise CheckpointFileError(
            f"{what} folder {path} {state}: missing {', '.join(missing)} (a Hugging Face model "
            "folder as save_pretrained or `hf download` writes it)"
        )
    read_json_file(path / "config.json")
    shards = set()
    if "model.safetensors.index.json" in files:
        index = read_json_file(path / "model.safetensors.index.json")
        shards = set((index.get("weight_map") or {}).values())
        absent = sorted(shards - files)
        if absent:
            raise CheckpointFileError(
                f"{what} folder {path} is incomplete: missing {', '.join(absent)} (listed in "
                "model.safetensors.index.json)"
            )
    for name in sorted(files | shards):
        if name.endswith(".safetensors"):
            check_safetensors_file(path / name)
