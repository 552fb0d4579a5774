"""Host vectors reused round after round (``common/run/buffers.py``), and the rounds of a
worker and of a shard that, once warm, allocate no vector of the model's size (numpy's
allocations, which ``tracemalloc`` sees)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from common.learn.data import load_dataset
from common.net.protocol import Params, Welcome, decode, encode
from common.run.buffers import HostBuffers
from common.run.config import AttackConfig, RunConfig
from common.run.model_init import initial_parameters
from server.group import ShardGroup
from worker.core import ClientCore, NextRound, RetryPolicy
from worker.step import WorkerStep
from worker.trainer import GradientComputer


def test_a_vector_is_handed_out_again_once_nothing_references_it() -> None:
    pool = HostBuffers(1000)
    first = pool.take()
    first[:] = 7.0
    address = first.ctypes.data
    del first
    again = pool.take()
    assert again.ctypes.data == address and pool.allocated == 1
    assert np.all(again == 7.0)  # its content is left as it was


@pytest.mark.parametrize("holder", [
    lambda v: v[10:20],  # a view
    lambda v: memoryview(v)[4:],  # a buffer export (what a zero-copy frame holds)
    lambda v: torch.from_numpy(v),  # a tensor sharing its memory
    lambda v: [v],  # any other reference
])
def test_a_vector_something_still_references_is_not_handed_out(holder) -> None:
    pool = HostBuffers(1000)
    first = pool.take()
    kept = holder(first)
    address = first.ctypes.data
    del first
    second = pool.take()
    assert second.ctypes.data != address and pool.allocated == 2
    del kept, second
    assert pool.take().ctypes.data in {address, pool._vectors[1].ctypes.data}
    assert pool.allocated == 2


def test_vectors_are_float32_of_the_length_asked() -> None:
    pool = HostBuffers(123)
    v = pool.take()
    assert v.dtype == np.float32 and v.shape == (123,) and v.flags.writeable
    with pytest.raises(ValueError, match="cannot hold -1"):
        HostBuffers(-1)


@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_views_of_a_tensor_s_vector_hold_the_vector(dtype) -> None:
    """The pinned vectors (CUDA) are a tensor's memory: a view of one must reference the
    vector itself, as a zero-copy frame of a pushed slice does, or the pool would hand
    it out while it is being sent (here on unpinned memory, the same layout)."""
    from common.run.buffers import _references, tensor_vector

    _, vector = tensor_vector(100, np.dtype(dtype), pinned=False)
    held = [vector]
    before = _references(held, 0)
    frame = memoryview(vector[10:20])
    assert _references(held, 0) == before + 1
    del frame
    assert _references(held, 0) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_pinned_vectors_need_cuda() -> None:
    with pytest.raises(RuntimeError):
        HostBuffers(10, pinned=True).take()


CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rule="marmed",
                rounds=40).validate()
REPLAY = 3
WARM_UP = 2 * (REPLAY + 2)


def _growth_of_rounds(run_round, rounds: range) -> int:
    """The largest rise of numpy's allocated bytes (tracemalloc) within any one of
    ``rounds`` (``run_round(t)`` runs round t), over what was allocated before it."""
    worst = 0
    tracemalloc.start()
    try:
        for t in rounds:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            run_round(t)
            worst = max(worst, tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    return worst


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_warm_worker_round_allocates_no_vector_of_the_model_s_size(momentum: float) -> None:
    """A worker's round as its process runs it: the step (gradient, momentum) into its
    pushed vector, the push of each server's slices, the PARAMS replies received into a
    vector: after the warm-up none allocates d values (tracemalloc sees numpy's
    allocations; without the pools each round allocates two vectors of d)."""
    cfg = RunConfig(**{**CFG.__dict__, "worker_momentum": momentum}).validate()
    computer = GradientComputer(cfg, load_dataset(cfg.dataset, seed=cfg.seed))
    d = computer.d
    step = WorkerStep(cfg, AttackConfig().validate(cfg), computer, 0, HostBuffers(d))
    ranges = [(0, d // 2), (d // 2, d)]
    core = ClientCore(cfg, "worker", 0, ["tcp://s0:1", "tcp://s1:1"],
                      RetryPolicy(10.0, 1), REPLAY, HostBuffers(d))
    core.hello(0.0)
    for s, (a, b) in enumerate(ranges):
        core.handle(s, decode(encode(Welcome(shards=[s], num_shards=2, d=d, length=b - a,
                                             round=0, rounds=cfg.rounds))), 0.0)
    x0 = initial_parameters(cfg)
    replies = {t: [decode(encode(Params(round=t, shards=[s], length=b - a),
                                 x0[a:b] + np.float32(t)))
                   for s, (a, b) in enumerate(ranges)] for t in range(1, cfg.rounds)}
    at = NextRound(0, x0.copy())

    def run_round(t: int) -> None:
        nonlocal at
        g, _ = step(at.params, t)
        core.push(t, g, float(t))
        for s in (0, 1):
            core.handle(s, replies[t + 1][s], float(t))
        at = core.outcome
        assert at.round == t + 1

    for t in range(WARM_UP):
        run_round(t)
    np.testing.assert_array_equal(at.params, x0 + np.float32(WARM_UP))
    growth = _growth_of_rounds(run_round, range(WARM_UP, cfg.rounds - 1))
    assert growth < d * 4 // 4, f"a warm round allocated {growth:,} bytes (d = {d:,})"


def test_a_warm_shard_round_allocates_no_vector_of_the_shard_s_size() -> None:
    """A server's shard: n pushes copied in, the rule, x - lr * Aggr into a reused vector
    (the history keeps the last rounds, which hold theirs), the finiteness checks: once
    warm a round allocates the rule's result and nothing else of the shard's size (the
    code before allocated four more: lr * Aggr, x^{t+1} and two masks)."""
    size = 200_000
    group = ShardGroup(CFG, [0], np.zeros(size * CFG.num_shards, dtype=np.float32))
    rows = [np.full(size, i + 1, dtype=np.float32) for i in range(CFG.num_workers)]

    def run_round(t: int) -> None:
        for i, row in enumerate(rows):
            group.push(t, i, row)
        group.step()

    for t in range(WARM_UP):
        run_round(t)
    growth = _growth_of_rounds(run_round, range(WARM_UP, WARM_UP + 10))
    assert growth < size * 4 * 5 // 4, f"a warm round allocated {growth:,} bytes"
    assert group.states[0].vectors.allocated <= 6  # the history's rounds and the one being made
