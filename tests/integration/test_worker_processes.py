"""Worker processes running several workers, through real processes: n workers in fewer
processes (with keys, Byzantine workers and momentum among them), and a process of two
workers killed and restarted by the launcher. Each worker keeps its own key,
connections and metrics; every run ends bit-identical to the reference engine, which
knows nothing of processes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from common.config import AttackConfig, RunConfig
from common.metrics import read_jsonl
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.reference.engine import simulate
from tests.integration.conftest import wait_for
from tests.integration.test_faults import _children
from worker.options import ClientOptions, EvalOptions

pytestmark = pytest.mark.integration


def test_seven_workers_in_three_processes_end_bit_identical(tmp_path: Path) -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=7, num_shards=3, rule="meamed", q=2,
                    rounds=12, seed=11, worker_momentum=0.9).validate()
    attack = AttackConfig.build(worker_attack="alie", byzantine_workers=(1, 5)).validate(cfg)
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=tmp_path / "run",
                       evaluation=EvalOptions(eval_every=6),
                       client=ClientOptions(timeout_s=30, retries=2),
                       cluster=ClusterOptions(run_timeout_s=240, server_processes=2,
                                              worker_processes=3))
    result = Cluster(spec).run()
    out = tmp_path / "run"
    started = sorted(p.stem for p in (out / "logs").glob("worker-*.log"))
    assert started == ["worker-0", "worker-3", "worker-5"]  # blocks 0-2, 3-4, 5-6
    for i in range(7):  # each worker its own metrics, every round
        assert [x["round"] for x in read_jsonl(out / f"worker-{i}.jsonl")] == list(range(12))
    # each worker said HELLO with its own key: the servers saw seven workers each round
    assert all(x["workers"] == list(range(7)) for x in read_jsonl(out / "server-0.jsonl"))
    assert "byzantine: alie" in (out / "logs" / "worker-5.log").read_text()
    torch.set_num_threads(1)  # the processes use one thread; so must the reference
    reference = simulate(cfg, attack)
    assert reference.digest == result.digest
    np.testing.assert_array_equal(reference.params, result.params)


def test_a_killed_process_of_two_workers_is_restarted_and_the_run_ends_bit_identical(
        processes, tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = processes.start("cluster", "ps.launcher.cli", [
        "--dataset", "synthetic", "--workers", "4", "--shards", "2", "--server-processes",
        "1", "--worker-processes", "2", "--rule", "mean", "--q", "0", "--rounds", "60",
        "--seed", "5", "--out-dir", str(out), "--no-evaluator", "--timeout", "5",
        "--verify"])
    wait_for(lambda: len(read_jsonl(out / "server-0.jsonl")) >= 15, 120, "round 15")
    children = _children(launcher)
    assert {"server-0", "worker-0", "worker-2"} <= set(children)
    assert "worker-1" not in children and "worker-3" not in children
    os.kill(children["worker-2"], signal.SIGKILL)  # workers 2 and 3 with it
    assert processes.wait_exit(launcher, 240) == 0, launcher.tail(30)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert [r["process"] for r in summary["restarts"]] == ["worker-2"]
    assert any("verified" in line for line in launcher.tail(5))
    for i in (2, 3):  # both came back: their metrics reach the last round
        assert read_jsonl(out / f"worker-{i}.jsonl")[-1]["round"] == 59
