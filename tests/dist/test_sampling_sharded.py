"""TP batch-sharded sequential sampling: layout, preconditions, and bitwise agreement with the
replicated walk in 2, 3 and 4 gloo processes (tests/dist/sharded_walk_check.py)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from common.sampling.sharded import owner_layout, sharding_disabled_reason
from tests.dist.sharded_walk_check import spawn_check

REPO = Path(__file__).resolve().parents[2]


def test_owner_layout():
    send, src = owner_layout(5, 2)
    assert send.tolist() == [[0, 2, 4], [1, 3, -1]]
    gathered = send.flatten()  # what the all-gather returns, rank-major
    assert gathered[src].tolist() == [0, 1, 2, 3, 4]
    send, src = owner_layout(2, 4)  # batch < tp: capacity 1, two idle ranks
    assert send.tolist() == [[0], [1], [-1], [-1]]
    assert send.flatten()[src].tolist() == [0, 1]


def test_sharding_disabled_reason_follows_seed_order():
    class Fused:
        def sample_sequential(self):
            pass

        def compute_draft_logits_local(self):
            pass

    class NoLocal:
        pass

    class Ok:
        def compute_draft_logits_local(self):
            pass

    base = dict(
        model=Fused(),
        tp_size=2,
        draft_logits_replicated=True,
        use_acceptance_estimator=True,
        draft_topk=4,
        lm_head_tp_size=1,
        communicator=None,
    )
    expected = [
        ("draft_logits_replicated", False, "the draft logits cache is replicated"),
        ("use_acceptance_estimator", False, "the online acceptance estimator"),
        ("draft_topk", None, "top-k Markov sampling is not supported"),
        ("model", NoLocal(), "the draft model fuses its own sequential sampling"),
        ("model", Ok(), "the draft model cannot compute vocab-sharded draft logits"),
        ("lm_head_tp_size", 2, "the draft model cannot compute vocab-sharded draft logits"),
        ("communicator", object(), "no communicator"),
    ]
    kw = dict(base)
    for key, fixed, reason in expected:
        assert sharding_disabled_reason(**kw).startswith(reason), (key, reason)
        kw[key] = fixed
    assert sharding_disabled_reason(**kw) is None
    kw["lm_head_tp_size"] = None  # slices its lm_head per call: any tp works
    assert sharding_disabled_reason(**kw) is None


@pytest.mark.parametrize(
    "world_size, a2a, confidence",
    [
        (2, "all_gather", ("recompute", "gather")),
        (3, "all_to_all_single", ("recompute",)),
        (4, "auto", ("recompute",)),
    ],
)
def test_sharded_walk_bitwise_equals_replicated(world_size, a2a, confidence):
    torch.set_num_threads(torch.get_num_threads())  # parent state is irrelevant to forked ranks
    spawn_check(world_size, "gloo", "cpu", a2a, confidence)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_torchrun_launch():
    """The same script as a GPU run would launch it (there with --backend nccl)."""
    cmd = ["torchrun", "--nproc-per-node", "2", "tests/dist/sharded_walk_check.py"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        cmd + ["--backend", "gloo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # Both ranks ran the walk: rank 0 reports the world torchrun made, over the backend asked for.
    assert re.search(r"OK: [1-9]\d* cases bit-identical on tp=2 \(gloo\)", res.stdout), res.stdout
