"""scripts/bench_floor.py: the synthetic cluster runs its rounds and leaves no process.

The script runs as a command (tests import nothing from ``scripts/``), in a session of
its own: its ``--json`` record gives the figures, and once it exited no process of its
session (its synthetic nodes) may be left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def session_members(sid: int) -> list[int]:
    """The processes still in session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) == sid:  # (state, ppid, pgrp, session, ...)
            found.append(int(entry.name))
    return found


def floor(tmp_path: Path, *flags: str) -> dict:
    """The one record of ``bench_floor.py`` run with ``flags`` (3 workers, 2 shards,
    d = 1001, 0.5 ms per gradient, 0.1 ms per aggregation, 80 rounds)."""
    record = tmp_path / "floor.json"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "bench_floor.py"), "--workers", "3",
         "--shards", "2", "--d", "1001", "--compute-ms", "0.5", "--aggregate-ms", "0.1",
         "--rounds", "80", "--json", str(record), *flags],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    assert process.returncode == 0, output[-4000:]
    assert session_members(process.pid) == [], "bench_floor.py left processes behind"
    (only,) = json.loads(record.read_text())
    return only


@pytest.mark.parametrize("curve", [False, True])
def test_floor_runs_every_round_and_cleans_up(curve: bool, tmp_path: Path) -> None:
    got = floor(tmp_path, *([] if curve else ["--insecure"]))
    assert (got["workers"], got["shards"], got["d"], got["curve"]) == (3, 2, 1001, curve)
    assert (got["processes"], got["worker_processes"]) == (2, 3)  # P = S, W = n
    # each round spins 0.5 ms in every worker, then 0.1 ms in every server
    assert 0 < got["rounds_per_s"] < 1e3 / 0.6
    # the three workers' spinning alone is 1.5 ms of CPU a round (/proc counts in ticks
    # of 10 ms: 80 rounds make it at least 12 of them)
    assert got["cpu_ms_per_round"] >= 1.0


def test_floor_runs_workers_in_fewer_processes(tmp_path: Path) -> None:
    """Three workers in two processes on one server process: the second worker of a
    process gets bare PARAMS (the header alone) and the rounds still all complete."""
    got = floor(tmp_path, "--processes", "1", "--worker-processes", "2")
    assert (got["processes"], got["worker_processes"]) == (1, 2)
    # a process of two workers spins 2 x 0.5 ms a round before its pushes are all out
    assert 0 < got["rounds_per_s"] < 1e3 / 1.1
    assert got["cpu_ms_per_round"] >= 1.0
