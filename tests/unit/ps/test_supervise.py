"""The launcher's supervision and report, on fake processes: restarts, lost workers
against the quorum, failures for good, the run deadline, ``summary.json``."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from common.errors import EXIT_CONFIG, EXIT_PEER, ClusterTimeout
from ps.launcher.options import ClusterOptions
from ps.launcher.report import RunReport
from ps.launcher.supervise import AFTER_END_GRACE_S, ProcessFailed, Supervisor


@dataclass
class FakeProcess:
    """A child that has exited with ``returncode`` (None: still running)."""

    name: str
    returncode: int | None = None
    generation: int = 0
    signals: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.returncode is None

    def signal(self, signum: int) -> None:
        self.signals.append(signum)

    def tail(self) -> list[str]:
        return [f"{self.name} last line"]


def respawn(old: FakeProcess) -> FakeProcess:
    return FakeProcess(old.name, None, old.generation + 1)


def supervisor(names: list[str], max_restarts: int = 0, quorum: int = 2,
               run_timeout_s: float | None = None, teams: dict[str, int] | None = None,
               ) -> Supervisor:
    options = ClusterOptions(max_restarts=max_restarts, run_timeout_s=run_timeout_s)
    return Supervisor([FakeProcess(n) for n in names], respawn, options,  # type: ignore[arg-type]
                      quorum=quorum, workers_of=lambda name: (teams or {}).get(name, 1))


def test_a_crashed_process_is_restarted_in_place_until_its_restarts_are_spent() -> None:
    s = supervisor(["server-0", "worker-0"], max_restarts=2)
    for generation in (1, 2):
        s.processes[0].returncode = -9
        s.check()
        assert s.processes[0].generation == generation and s.processes[0].running
    assert [r["process"] for r in s.restarts] == ["server-0", "server-0"]
    assert s.restarts[0]["exit_code"] == -9
    s.processes[0].returncode = -9
    with pytest.raises(ProcessFailed, match=r"server-0 exited with code -9 \(after 2 restarts\)"):
        s.check()


def test_a_process_refused_its_settings_is_not_restarted() -> None:
    s = supervisor(["server-0", "worker-0"], max_restarts=3)
    s.processes[0].returncode = EXIT_CONFIG
    with pytest.raises(ProcessFailed) as failed:
        s.check()
    assert failed.value.exit_code == EXIT_CONFIG and s.restarts == []


def test_workers_beyond_the_quorum_are_lost_and_the_run_goes_on_without_them() -> None:
    """n = 4 started workers, K = 2: two may die for good, the third ends the run."""
    s = supervisor(["server-0", *(f"worker-{i}" for i in range(4))], quorum=2)
    for i in (1, 3):
        s.processes[1 + i].returncode = -9
        s.check()
    assert s.lost == ["worker-1", "worker-3"]
    s.processes[1].returncode = -9
    with pytest.raises(ProcessFailed, match="worker-0") as failed:
        s.check()
    assert failed.value.exit_code == EXIT_PEER


def test_the_spare_workers_are_counted_among_those_started() -> None:
    """A cluster that starts only K workers has none to spare (the chaos run)."""
    s = supervisor(["server-0", "worker-0", "worker-1"], quorum=2)
    s.processes[1].returncode = -9
    with pytest.raises(ProcessFailed, match="worker-0"):
        s.check()


def test_a_worker_process_is_lost_only_if_the_quorum_does_without_all_its_workers() -> None:
    # 8 workers in 4 processes of 2, quorum 6: one process (2 workers) may go, not two
    teams = {f"worker-{k}": 2 for k in (0, 2, 4, 6)}
    s = supervisor(["server-0", *teams], quorum=6, teams=teams)
    s.processes[2].returncode = -9
    s.check()
    assert s.lost == ["worker-2"]
    s.processes[3].returncode = -9
    with pytest.raises(ProcessFailed, match="worker-4 exited with code -9"):
        s.check()
    # a process of 3 workers when only 2 may go: refused at once
    s = supervisor(["server-0", "worker-0", "worker-3"], quorum=4,
                   teams={"worker-0": 3, "worker-3": 3})
    s.processes[1].returncode = -9
    with pytest.raises(ProcessFailed, match="worker-0"):
        s.check()


def test_a_server_is_never_lost() -> None:
    s = supervisor(["server-0", *(f"worker-{i}" for i in range(4))], quorum=2)
    s.processes[0].returncode = -9
    with pytest.raises(ProcessFailed, match="server-0"):
        s.check()


def test_watching_ends_when_every_process_finished_or_was_lost() -> None:
    s = supervisor(["server-0", "worker-0", "worker-1"], quorum=1, run_timeout_s=2.0)
    s.processes[2].returncode = -9  # while the server runs: lost
    s.check()
    s.processes[0].returncode = 0
    s.processes[1].returncode = 0
    s.watch(started=time.monotonic())
    assert s.lost == ["worker-1"]


def test_watching_stops_at_the_run_deadline_naming_who_still_runs() -> None:
    s = supervisor(["server-0", "worker-0"], run_timeout_s=1.0)
    s.processes[0].returncode = 0
    with pytest.raises(ClusterTimeout, match=r"still running: worker-0$"):
        s.watch(started=0.0)  # (time.monotonic() is far past 1 s after 0)


def test_the_summary_of_a_failed_run_names_how_why_and_the_restarts(tmp_path: Path) -> None:
    report = RunReport(tmp_path, rounds=30)
    report.begin()
    report.mark("servers_ready_s")
    (tmp_path / "server-0.jsonl").write_text("".join(
        json.dumps({"round": t, "time": report.launched + 1 + t, **({"missing": [3]} if t
                                                                   else {})}) + "\n"
        for t in range(3)))
    restarts = [{"process": "worker-2", "exit_code": -9, "after_s": 1.5}]
    report.failed(ProcessFailed("server-1", -9, ["boom"], 1), restarts, ["worker-3"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {k: summary[k] for k in ("outcome", "reason", "exit_code", "rounds", "rounds_done",
                                    "restarts", "lost", "rounds_closed_at_deadline_shard0")} == {
        "outcome": "failed", "reason": "server-1 exited with code -9 (after 1 restarts)",
        "exit_code": EXIT_PEER, "rounds": 30, "rounds_done": 3, "restarts": restarts,
        "lost": ["worker-3"], "rounds_closed_at_deadline_shard0": 2}
    assert list(summary["startup"]) == ["servers_ready_s"]  # round 0 once all started
    report.mark("all_started_s")
    report.failed(KeyboardInterrupt(), [], [])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["outcome"], summary["exit_code"]) == ("interrupted", 130)
    assert summary["startup"]["round0_done_s"] == pytest.approx(1.0, abs=1e-3)


def test_a_worker_that_fails_after_every_server_finished_is_not_restarted() -> None:
    """Restarted, it would only wait for servers that are gone (the run is over)."""
    s = supervisor(["server-0", "server-1", "worker-0", "worker-1"], max_restarts=3, quorum=2)
    s.processes[0].returncode = 0
    s.processes[2].returncode = 3  # one server still runs: restarted
    s.check()
    assert s.processes[2].generation == 1 and s.after_end == []
    s.processes[1].returncode = 0
    s.processes[3].returncode = 0
    s.processes[2].returncode = 3  # every server finished: not restarted, and not lost
    s.check()
    assert s.processes[2].generation == 1 and s.after_end == ["worker-0"] and s.lost == []
    s.watch(time.monotonic())  # returns: nothing left running


def test_the_summary_of_a_finished_run_names_workers_that_failed_after_it(
        tmp_path: Path) -> None:
    report = RunReport(tmp_path, rounds=3)
    report.begin()
    (tmp_path / "server-0.jsonl").write_text("".join(
        json.dumps({"round": t, "time": report.launched + 1 + t}) + "\n" for t in range(3)))
    report.finished(np.zeros(4, dtype=np.float32), [], [], ["worker-2"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["lost"] == []
    assert summary["failed_after_servers_finished"] == ["worker-2"]


def test_a_worker_still_running_after_the_servers_finished_is_stopped() -> None:
    """A worker that stopped answering (left out at the rounds' deadline) must not hold
    the launcher: a grace for the last PARAMS, then SIGTERM (with SIGCONT, which a
    stopped process needs to get it); ``watch`` returns, and the cluster's ``stop_all``
    SIGKILLs it if SIGTERM did not end it."""
    s = supervisor(["server-0", "worker-0", "worker-1"], quorum=1)
    s.processes[0].returncode = 0
    s.processes[1].returncode = 0
    s.stop_stragglers(100.0)
    s.stop_stragglers(100.0 + AFTER_END_GRACE_S - 0.1)
    assert s.processes[2].signals == [] and s.after_end == []
    s.stop_stragglers(100.0 + AFTER_END_GRACE_S)
    assert s.processes[2].signals == [signal.SIGTERM, signal.SIGCONT]
    assert s.after_end == ["worker-1"]
    s.stop_stragglers(100.0 + AFTER_END_GRACE_S + 60.0)
    assert s.processes[2].signals == [signal.SIGTERM, signal.SIGCONT]  # once
    s.watch(time.monotonic())  # returns: the straggler counts as failed after the end


def test_no_worker_is_stopped_while_a_server_runs() -> None:
    s = supervisor(["server-0", "server-1", "worker-0"], quorum=1)
    s.processes[0].returncode = 0
    s.stop_stragglers(0.0)
    s.stop_stragglers(1e6)
    assert s.processes[2].signals == [] and s.servers_done_at is None
