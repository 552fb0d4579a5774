"""shard_ranges covers [0, d) exactly; derived random streams are reproducible."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.learn.seeding import derive_int_seed, derive_rng
from common.net.sharding import shard_ranges


@given(st.integers(1, 10**7), st.integers(1, 64))
def test_shard_ranges_cover_contiguously_and_near_equally(d: int, s: int) -> None:
    if s > d:
        with pytest.raises(ValueError):
            shard_ranges(d, s)
        return
    ranges = shard_ranges(d, s)
    assert len(ranges) == s
    assert ranges[0][0] == 0 and ranges[-1][1] == d
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [b - a for a, b in ranges]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_shard_ranges_example_and_errors() -> None:
    assert shard_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    for d, s in [(0, 1), (5, 0), (3, 4)]:
        with pytest.raises(ValueError):
            shard_ranges(d, s)


def test_derived_streams_are_reproducible_and_independent() -> None:
    a = derive_rng(7, "minibatch", 1, 2).random(5)
    assert (a == derive_rng(7, "minibatch", 1, 2).random(5)).all()
    assert not (a == derive_rng(7, "minibatch", 2, 1).random(5)).all()
    assert not (a == derive_rng(7, "dropout", 1, 2).random(5)).all()
    assert not (a == derive_rng(8, "minibatch", 1, 2).random(5)).all()
    assert derive_int_seed(1, "x", 3) == derive_int_seed(1, "x", 3) < 2**63
    with pytest.raises(ValueError):
        derive_rng(-1, "x")
