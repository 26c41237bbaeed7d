"""The lab's tests reuse the product suites' fixtures (tests/conftest.py), which pytest does not
load for a run of lab/tests alone: importing them here registers them."""

from tests.conftest import (  # noqa: F401
    make_config,
    make_model,
    random_target,
    target,
    torch_single_thread,
)
