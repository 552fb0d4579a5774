"""Worker processes running several workers, through real processes: n workers in fewer
processes (with keys, Byzantine workers and momentum among them), a process of two
workers killed and restarted by the launcher, and one stopped while rounds close at
their deadline without its workers. Each worker keeps its own key,
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

from common.conf.settings import SERVER, to_argv
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.reference.engine import simulate
from ps.reference.participation import read_participation
from server.checkpoint import final_parameters, params_digest
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
    first = (out / "logs" / "worker-0.log").read_text()  # honest workers compute first
    assert first.index("worker 2 of 7:") < first.index("worker 1 of 7 (byzantine: alie)")
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


DEADLINE_CFG = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rule="marmed", q=2,
                         rounds=30, seed=4).validate()


def test_a_stopped_process_of_two_workers_misses_rounds_and_both_catch_up(
        processes, tmp_path: Path) -> None:
    """Rounds close at their deadline (quorum 3 of 5) without a stopped process's two
    workers; once it
    goes on, both find their round closed (stale-round), catch up together and push
    every later round; the run is the reference engine's replaying who was there."""
    ready = tmp_path / "server.endpoint"
    server = processes.start("server-0", "server.cli", [
        "--shard", "0-1", "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
        "--out-dir", str(tmp_path), "--linger", "0", "--insecure", "--round-timeout", "0.4",
        "--quorum", "3", *to_argv(DEADLINE_CFG, SERVER)])
    endpoint = processes.endpoint(ready, server)
    teams = [processes.start(f"worker-{first}", "worker.cli", [
        "--servers", endpoint, "--worker-id", ids, "--timeout", "30", "--insecure",
        "--out-dir", str(tmp_path), *to_argv(DEADLINE_CFG, SERVER)])
        for first, ids in ((0, "0-1"), (2, "2-4"))]
    rounds = tmp_path / "server-0.jsonl"
    wait_for(lambda: len(read_jsonl(rounds)) >= 4, 120, "round 4")
    os.kill(teams[0].pid, signal.SIGSTOP)
    try:
        wait_for(lambda: sum(r["missing"] == [0, 1] for r in read_jsonl(rounds)) >= 3, 60,
                 "three rounds closed without workers 0 and 1")
    finally:
        os.kill(teams[0].pid, signal.SIGCONT)
    for team in teams:
        assert processes.wait_exit(team, 120) == 0, team.tail()
    assert processes.wait_exit(server, 60) == 0
    log = "\n".join(teams[0].tail(80))
    assert "worker 0: round" in log and "worker 1: round" in log and "caught up" in log
    lines = read_jsonl(rounds)
    assert [r["round"] for r in lines] == list(range(DEADLINE_CFG.rounds))
    assert lines[-1]["missing"] == []  # both are back to the end
    for i in (0, 1):  # each recorded the rounds it pushed, the last among them
        assert read_jsonl(tmp_path / f"worker-{i}.jsonl")[-1]["round"] == 29
    torch.set_num_threads(1)
    replay = read_participation(tmp_path, DEADLINE_CFG.num_shards, DEADLINE_CFG.num_workers,
                                DEADLINE_CFG.rounds)
    reference = simulate(DEADLINE_CFG, AttackConfig(), participation=replay)
    assert reference.digest == params_digest(final_parameters(tmp_path, DEADLINE_CFG, None))
