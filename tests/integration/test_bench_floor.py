"""scripts/bench_floor.py: the synthetic cluster runs its rounds and leaves no process."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_floor import measure_floor  # a script, not a package


@pytest.mark.parametrize("curve", [False, True])
def test_floor_runs_every_round_and_cleans_up(curve: bool) -> None:
    floor = measure_floor(workers=3, shards=2, d=1001, curve=curve, compute_ms=0.5,
                          aggregate_ms=0.1, rounds=80, warmup=3)
    assert (floor.workers, floor.shards, floor.d, floor.curve) == (3, 2, 1001, curve)
    # each round spins 0.5 ms in every worker, then 0.1 ms in every server
    assert 0 < floor.rounds_per_s < 1e3 / 0.6
    # the three workers' spinning alone is 1.5 ms of CPU a round (/proc counts in ticks
    # of 10 ms: 80 rounds make it at least 12 of them)
    assert floor.cpu_ms_per_round >= 1.0
    assert mp.active_children() == []


def test_floor_runs_workers_in_fewer_processes() -> None:
    """Three workers in two processes on one server process: the second worker of a
    process gets bare PARAMS (the header alone) and the rounds still all complete."""
    floor = measure_floor(workers=3, shards=2, d=1001, curve=True, compute_ms=0.5,
                          aggregate_ms=0.1, rounds=80, warmup=3, processes=1,
                          worker_processes=2)
    assert (floor.processes, floor.worker_processes) == (1, 2)
    # a process of two workers spins 2 x 0.5 ms a round before its pushes are all out
    assert 0 < floor.rounds_per_s < 1e3 / 1.1
    assert floor.cpu_ms_per_round >= 1.0
    assert mp.active_children() == []
