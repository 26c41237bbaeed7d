"""Reduced draft vocab: selection by (-count, id), padding with the lowest unused ids, ascending
order, `target = draft + d2t[draft]`, and the counts hash."""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch

from common.vocab import build_vocab_map, check_vocab_map, counts_hash


def reference_selection(counts: list[int], k: int) -> list[int]:
    """Naive restatement of dspark.md: top k seen ids by (-count, id), pad with the lowest unused
    ids, sort ascending."""
    seen = sorted((i for i, c in enumerate(counts) if c > 0), key=lambda i: (-counts[i], i))[:k]
    pad = [i for i in range(len(counts)) if i not in seen][: k - len(seen)]
    return sorted(seen + pad)


def check_invariants(vm, v: int, k: int):
    assert vm.d2t.dtype == torch.int64 and vm.d2t.shape == (k,)
    assert vm.t2d.dtype == torch.bool and vm.t2d.shape == (v,)
    draft = torch.arange(k)
    target = draft + vm.d2t[draft]  # the vLLM mapping, on every draft id
    assert torch.equal(target, vm.selected)
    assert bool((target[1:] > target[:-1]).all())  # sorted ascending, distinct
    assert int(vm.t2d.sum()) == k and vm.t2d[target].all()
    assert check_vocab_map(vm.d2t, v) == []


def test_padding_with_lowest_unused_ids():
    counts = torch.zeros(10, dtype=torch.int64)
    counts[7], counts[2] = 3, 1  # only two ids seen, draft vocab of 5
    vm = build_vocab_map(counts, 5)
    assert vm.selected.tolist() == [0, 1, 2, 3, 7]
    assert vm.d2t.tolist() == [0, 0, 0, 0, 3]
    check_invariants(vm, 10, 5)


def test_ordering_ties_broken_by_id():
    counts = torch.tensor([0, 5, 3, 5, 3, 0, 9, 3])
    # By (-count, id): 6 (9), 1 (5), 3 (5), then the tie among 2, 4, 7 (3) keeps the lowest id.
    assert build_vocab_map(counts, 4).selected.tolist() == [1, 2, 3, 6]
    assert build_vocab_map(counts, 5).selected.tolist() == [1, 2, 3, 4, 6]
    # A higher id never beats a lower one at equal count, whatever the array order.
    assert build_vocab_map(torch.tensor([2, 2, 2, 2]), 2).selected.tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(5))
def test_matches_naive_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    v = 200
    counts = torch.randint(0, 4, (v,), generator=gen) * (torch.rand(v, generator=gen) < 0.3)
    for k in (1, 17, int((counts > 0).sum()), 120, v):
        vm = build_vocab_map(counts, k)
        assert vm.selected.tolist() == reference_selection(counts.tolist(), k), k
        check_invariants(vm, v, k)


def test_full_size_is_identity_and_bad_sizes_raise():
    vm = build_vocab_map(torch.tensor([0, 3, 1]), 3)
    assert vm.d2t.tolist() == [0, 0, 0] and vm.t2d.all()
    for k in (0, 4):
        with pytest.raises(ValueError, match="draft_vocab_size"):
            build_vocab_map(torch.tensor([0, 3, 1]), k)


def test_counts_hash_stable_and_sensitive():
    counts = torch.tensor([5, 0, 3, 3, 1, 0, 7])
    # Pinned definition: sha256 of the little-endian int64 counts.
    expected = hashlib.sha256(struct.pack("<7q", 5, 0, 3, 3, 1, 0, 7)).hexdigest()
    assert counts_hash(counts) == expected
    assert counts_hash(counts.to(torch.int32)) == expected  # dtype of the input does not matter
    assert build_vocab_map(counts, 3).counts_hash == expected
    assert build_vocab_map(counts.clone(), 4).counts_hash == expected  # size recorded apart
    bumped = counts.clone()
    bumped[4] += 1
    assert counts_hash(bumped) != expected
    assert counts_hash(counts.flip(0)) != expected
    assert counts_hash(torch.cat([counts, torch.zeros(1, dtype=counts.dtype)])) != expected


def test_check_vocab_map_problems():
    good = build_vocab_map(torch.tensor([1, 0, 4, 0, 2, 9]), 3).d2t
    assert check_vocab_map(good, 6) == []
    assert any("int64" in p for p in check_vocab_map(good.to(torch.int32), 6))
    assert any("outside [0, 5)" in p for p in check_vocab_map(good, 5))
    assert any("strictly increasing" in p for p in check_vocab_map(torch.tensor([2, 0, 0]), 6))
    assert any("outside" in p for p in check_vocab_map(torch.tensor([-1, 0, 0]), 6))
