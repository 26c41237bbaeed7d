"""Fixtures shared by every suite (this conftest is also loaded for tests/vllm and
tests/interop).

The tiny models live in `tests/tiny.py`, the one source for every suite: the drafts
(`tiny_config`, `tiny_model`; also importable from here, as `from tests.conftest import
tiny_config`) as the fixtures `make_config` / `make_model`, the checkpoint suites' random
target folder as `random_target`, and the distill suites' tiny chat target with its data as
`target` (a suite that needs another target defines its own).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.tiny import TINY, tiny_config, tiny_model, write_random_target

__all__ = ["TINY", "tiny_config", "tiny_model"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per pytest-xdist worker: the workers share the cores between them.
    torch.set_num_threads(1)


@pytest.fixture
def make_config():
    return tiny_config


@pytest.fixture
def make_model():
    return tiny_model


@pytest.fixture(scope="session")
def random_target(tmp_path_factory) -> Path:
    """A random tiny Qwen3 target folder (6 layers, so the default layer ids are [1, 2, 3];
    H=64, V=320) with its word-level tokenizer."""
    return write_random_target(tmp_path_factory.mktemp("random_target") / "target")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """A random tiny Qwen3 chat target with its tokenizer and data/{train,heldout}.jsonl, one per
    test module (`tests/tiny_assets.build_tiny_random_target`)."""
    from tests.tiny_assets import build_tiny_random_target

    return build_tiny_random_target(tmp_path_factory.mktemp("target") / "t")


@pytest.fixture
def torch_single_thread():
    """Run a test on one intra-op thread: tiny tensors gain nothing from threads, and on a shared
    2-core machine thread hand-offs dominate (tens of times slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
