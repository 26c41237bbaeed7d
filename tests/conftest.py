"""Fixtures shared by every suite (this conftest is also loaded for tests/vllm).

The tiny drafts live in `tests/tiny.py` (`tiny_config`, `tiny_model`; also importable from
here, as `from tests.conftest import tiny_config`), exposed as the fixtures `make_config` /
`make_model`.
"""

from __future__ import annotations

import pytest
import torch

from tests.tiny import TINY, tiny_config, tiny_model

__all__ = ["TINY", "tiny_config", "tiny_model"]


@pytest.fixture
def make_config():
    return tiny_config


@pytest.fixture
def make_model():
    return tiny_model


@pytest.fixture
def torch_single_thread():
    """Run a test on one intra-op thread: tiny tensors gain nothing from threads, and on a shared
    2-core machine thread hand-offs dominate (tens of times slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
