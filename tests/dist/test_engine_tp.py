"""The engine with batch-sharded sampling on 2 and 3 gloo processes equals the one-process engine
bit for bit (tests/dist/engine_tp_check.py), and tp > 1 without a process group is refused."""

import pytest

from serve.engine import EngineOptions, OptionsError
from tests.dist.engine_tp_check import spawn_engine_check


@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_engine_tp_sharded_sampling_equals_one_process(world_size, tmp_path):
    spawn_engine_check(world_size, str(tmp_path))


def test_tp_without_a_process_group_is_refused():
    from serve.engine import Engine
    from tests.unit.test_engine_helpers import make_draft, make_target

    target = make_target(0)
    opts = EngineOptions(target="<memory>", checkpoint="<memory>", dtype="float64", tp=2)
    with pytest.raises(OptionsError, match="torch.distributed"):
        Engine(target, make_draft(target), opts, eos_token_ids=[])
    with pytest.raises(OptionsError, match="tp=0"):
        EngineOptions(target="t", tp=0)
