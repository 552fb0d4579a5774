"""Crashed, stopped and restarted processes, through real processes: rounds close at
their deadline with a quorum, stragglers catch up, the launcher restarts what died and
resumes what was interrupted, and every run still ends bit-identical to the reference
engine replaying the participation the servers recorded."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from common.conf.settings import SERVER, to_argv
from common.learn.data import load_dataset
from common.net.keys import KeyRing
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from ps.launcher.processes import ManagedProcess
from ps.reference.engine import simulate
from ps.reference.participation import read_participation
from server.checkpoint import final_parameters, params_digest
from tests.integration.conftest import wait_for
from worker.evaluator import Evaluator

pytestmark = pytest.mark.integration

CFG = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rule="marmed", q=2,
                rounds=30, seed=3).validate()
DEADLINE = ["--round-timeout", "0.4", "--quorum", "3"]


def _rounds(out: Path, shard: int = 0) -> list[dict]:
    return read_jsonl(out / f"server-{shard}.jsonl")


def _reference(cfg: RunConfig, out: Path, participation: bool = True):
    import torch

    torch.set_num_threads(1)  # as the workers compute
    replay = (read_participation(out, cfg.num_shards, cfg.num_workers, cfg.rounds)
              if participation else None)
    return simulate(cfg, AttackConfig(), participation=replay)


def test_a_killed_and_a_stopped_worker_do_not_stall_the_rounds(processes, tmp_path) -> None:
    servers, nodes = [], []
    for s in range(CFG.num_shards):
        ready = tmp_path / f"server-{s}.endpoint"
        proc = processes.start(f"server-{s}", "server.cli", [
            "--shard", str(s), "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
            "--out-dir", str(tmp_path), "--linger", "0", "--insecure", *DEADLINE,
            *to_argv(CFG, SERVER)])
        servers.append(processes.endpoint(ready, proc))
        nodes.append(proc)
    # workers 2 and 3 each in a process of their own (to kill and to stop), the others
    # in one
    others, killed, straggler = (processes.start(f"workers-{ids}", "worker.cli", [
        "--servers", ",".join(servers), "--worker-id", ids, "--timeout", "30",
        "--insecure", *to_argv(CFG, SERVER)]) for ids in ("0,1,4", "2", "3"))
    wait_for(lambda: len(_rounds(tmp_path)) >= 4, 120, "round 4")
    killed.process.send_signal(signal.SIGKILL)  # gone for good
    os.kill(straggler.pid, signal.SIGSTOP)  # a straggler
    try:
        wait_for(lambda: sum(r["missing"] == [2, 3] for r in _rounds(tmp_path)) >= 3, 60,
                 "three rounds closed at their deadline without workers 2 and 3")
    finally:
        os.kill(straggler.pid, signal.SIGCONT)
    for proc in (others, straggler):
        assert processes.wait_exit(proc, 120) == 0, proc.tail()
    assert all(processes.wait_exit(node, 60) == 0 for node in nodes)
    assert any("caught up" in line for line in straggler.tail(50))
    for s in range(CFG.num_shards):
        rounds = _rounds(tmp_path, s)
        assert [r["round"] for r in rounds] == list(range(CFG.rounds))
        assert rounds[-1]["missing"] == [2]  # the straggler is back; the killed one is not
        assert all(sorted(r["workers"] + r["missing"]) == list(range(5)) for r in rounds)
    params = final_parameters(tmp_path, CFG, None)  # --insecure servers
    replayed = _reference(CFG, tmp_path)
    assert replayed.digest == params_digest(params)
    # the quorum costs little accuracy: against the run without faults
    clean = _reference(CFG, tmp_path, participation=False)
    evaluator = Evaluator(CFG, load_dataset("synthetic", seed=CFG.seed), 512)
    faulty_top1 = evaluator.evaluate(params).top1
    clean_top1 = evaluator.evaluate(clean.params).top1
    assert abs(faulty_top1 - clean_top1) <= 0.05, (faulty_top1, clean_top1)


def _cluster_args(out: Path, rounds: int, *extra: str, worker_processes: int = 4) -> list[str]:
    return ["--dataset", "synthetic", "--workers", "4", "--shards", "2", "--server-processes",
            "2", "--worker-processes", str(worker_processes), "--rule", "mean",
            "--q", "0", "--rounds", str(rounds), "--seed", "5", "--checkpoint-every", "10",
            "--out-dir", str(out), "--no-evaluator", "--timeout", "5", *extra]


def _children(launcher: ManagedProcess) -> dict[str, int]:
    """The launcher's living children by name (``/proc/PID/comm``: ``server-1``, ...)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == launcher.pid and state != "Z":
            found[name] = int(entry.name)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("worker_processes", [4, 2])
def test_a_killed_server_is_restarted_and_the_run_ends_bit_identical(
        processes, tmp_path, worker_processes: int) -> None:
    """With a process per worker, and with two workers a process (the second borrows
    the first's PARAMS values: a restart must not strand it)."""
    out = tmp_path / "run"
    launcher = processes.start("cluster", "ps.launcher.cli", _cluster_args(
        out, 60, "--verify", worker_processes=worker_processes))
    wait_for(lambda: len(_rounds(out, 1)) >= 15, 120, "round 15 on shard 1")
    children = _children(launcher)
    firsts = {4: ("worker-0", "worker-3"), 2: ("worker-0", "worker-2")}[worker_processes]
    assert {"server-0", "server-1", *firsts} <= set(children)
    os.kill(children["server-1"], signal.SIGKILL)
    assert processes.wait_exit(launcher, 240) == 0, launcher.tail(30)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert [r["process"] for r in summary["restarts"]] == ["server-1"]
    assert any("verified" in line for line in launcher.tail(5))


def test_a_run_whose_launcher_was_killed_resumes_bit_identical(processes, tmp_path) -> None:
    out = tmp_path / "run"
    launcher = processes.start("cluster", "ps.launcher.cli", _cluster_args(out, 60))
    wait_for(lambda: len(_rounds(out, 0)) >= 15, 120, "round 15")
    children = _children(launcher)
    assert {"server-0", "server-1", "worker-0", "worker-3"} <= set(children)
    launcher.process.send_signal(signal.SIGKILL)
    # its children get SIGTERM (parent-death signal): the servers save and exit
    wait_for(lambda: not any(_alive(pid) for pid in children.values()), 60,
             "the launcher's children to exit")
    stopped_at = [r["round"] for r in _rounds(out, 0)][-1]
    assert stopped_at < 59
    resumed = processes.start("resume", "ps.launcher.cli", ["--resume", str(out), "--verify"])
    assert processes.wait_exit(resumed, 240) == 0, resumed.tail(30)
    assert any("verified" in line for line in resumed.tail(5))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["rounds_done"] == 60
    # and the same as a run never interrupted (no round closed short here)
    cfg = RunConfig(dataset="synthetic", num_workers=4, num_shards=2, rule="mean", q=0,
                    rounds=60, seed=5).validate()
    np.testing.assert_array_equal(final_parameters(out, cfg, KeyRing(out / "keys")),
                                  _reference(cfg, out, False).params)


@pytest.mark.scenario
def test_under_the_default_flags_a_silent_worker_costs_one_deadline(processes, tmp_path) -> None:
    """Issue 35's first row: a worker that stops answering (SIGSTOP: alive and connected)
    under no deadline or quorum flags at all (keys on, n=6, S=2): one round closes at the
    default deadline without it, the rounds after it run at least at half the rate of
    those before, and the run ends bit-identical to the engine replaying the
    participation."""
    out = tmp_path / "run"
    launcher = processes.start("cluster", "ps.launcher.cli", [
        "--dataset", "synthetic", "--workers", "6", "--shards", "2", "--worker-processes", "6",
        "--rounds", "120", "--seed", "9", "--out-dir", str(out), "--no-evaluator", "--verify"])
    wait_for(lambda: len(_rounds(out, 1)) >= 30, 180, "round 30 on shard 1")
    stopped = _children(launcher)["worker-5"]
    os.kill(stopped, signal.SIGSTOP)
    try:
        assert processes.wait_exit(launcher, 240) == 0, launcher.tail(30)
    finally:
        if _alive(stopped):
            os.kill(stopped, signal.SIGCONT)
    assert any("verified" in line for line in launcher.tail(5))
    for s in range(2):
        rounds = _rounds(out, s)
        assert [r["round"] for r in rounds] == list(range(120))
        closed = [r["closed"] for r in rounds]
        assert closed.count("deadline") == 1, closed  # one deadline, then "present"
        first = closed.index("deadline")
        assert all(r["missing"] == [5] for r in rounds[first:])
        # the rounds' pace: the median time between rounds (robust to a moment in which
        # this 2-core machine runs something else), after against before
        gaps = np.diff([r["time"] for r in rounds])
        before, after = np.median(gaps[5:first - 1]), np.median(gaps[first + 1:])
        assert after <= 2 * before, (before, after)
