"""How the launcher supervises a started cluster until every process has finished.

A process that dies unexpectedly (killed, crashed; not a configuration error) is
started again, up to ``--max-restarts`` times each, by the cluster that started it
(same settings, same endpoint); a worker process with all its workers. A worker
process past its restarts is given up on while the servers' quorum K (``--quorum``; n
without a round deadline) does without its workers: the rounds close with the pushes
of the others. A worker process that fails once every server process has finished
(the run is over: the servers hold its result) is not restarted, which would only wait
for servers that are gone; one still running ``AFTER_END_GRACE_S`` after that (a worker
that stopped answering, left out of the rounds at their deadline) is stopped, SIGKILLed
if SIGTERM does not end it. Any other process failing for good, or the run outlasting
``--run-timeout``, ends the run (``ProcessFailed``, ``ClusterTimeout``).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from common.errors import EXIT_CONFIG, EXIT_PEER, EXIT_TIMEOUT, ClusterTimeout, PSError
from common.run.process import check_stop
from ps.launcher.options import ClusterOptions
from ps.launcher.processes import ManagedProcess

log = logging.getLogger("ps.cluster")

WATCH_INTERVAL_S = 0.5
# After every server process finished, how long a worker process may go on (its last
# PARAMS are on their way) before it is stopped.
AFTER_END_GRACE_S = 10.0


class ProcessFailed(PSError):
    """A process of the cluster failed for good: its exit code if a documented one
    (2 configuration, 3 peer, 4 timeout), else 3 (it crashed or was killed)."""

    def __init__(self, name: str, code: int, tail: list[str], restarts: int = 0) -> None:
        lines = "\n".join(f"    {line}" for line in tail)
        again = f" (after {restarts} restarts)" if restarts else ""
        self.reason = f"{name} exited with code {code}{again}"
        super().__init__(f"{self.reason}; its last log lines:\n{lines}")
        self.exit_code = code if code in (EXIT_CONFIG, EXIT_PEER, EXIT_TIMEOUT) else EXIT_PEER
        self.name = name


def restartable(code: int) -> bool:
    """A process that ended with ``code`` may succeed if started again: it was killed or
    crashed, not refused its settings (those would be refused again)."""
    return code not in (0, EXIT_CONFIG)


def raise_if_failed(processes: list[ManagedProcess]) -> None:
    """``ProcessFailed`` for the first of ``processes`` that exited with an error (while
    the cluster starts, when nothing is restarted)."""
    for p in processes:
        code = p.returncode
        if code not in (None, 0):
            raise ProcessFailed(p.name, code, p.tail())


class Supervisor:
    """Watches ``processes`` (the cluster's list, updated in place): restarts those that
    died with ``respawn`` (which starts a process like the one given, on its endpoint),
    gives up on workers the quorum does without, and ends the run otherwise.

    ``restarts`` records each restart (process, exit code, seconds into the run);
    ``lost`` names the worker processes given up on (both go to ``summary.json``);
    ``workers_of(name)`` is how many workers worker process ``name`` runs (one each
    by default)."""

    def __init__(self, processes: list[ManagedProcess],
                 respawn: Callable[[ManagedProcess], ManagedProcess],
                 options: ClusterOptions, quorum: int,
                 workers_of: Callable[[str], int] = lambda _name: 1) -> None:
        self.processes = processes
        self.respawn = respawn
        self.workers_of = workers_of
        self.max_restarts = options.max_restarts
        self.run_timeout_s = options.run_timeout_s
        self.quorum = quorum  # K: pushes a round needs to close at its deadline
        self.started = 0.0  # time.monotonic() at the start of the run
        self.restarts: list[dict[str, Any]] = []
        self.lost: list[str] = []
        self.after_end: list[str] = []  # worker processes that failed after the servers
        self.servers_done_at: float | None = None  # monotonic

    def watch(self, started: float, on_tick: Callable[[], None] | None = None) -> None:
        """Until every process exited 0 or was given up on, restarting those that died
        (within their restarts), calling ``on_tick`` every ``WATCH_INTERVAL_S``; raise
        when one failed for good, or ``run_timeout_s`` after ``started`` (monotonic)."""
        self.started = started
        limit = self.run_timeout_s
        while True:
            check_stop()
            self.check()
            if all(p.returncode == 0 or p.name in self.lost or p.name in self.after_end
                   for p in self.processes):
                return
            if limit is not None and time.monotonic() - started > limit:
                raise ClusterTimeout(
                    f"the run did not finish within {limit:g} s; still running: "
                    + ", ".join(p.name for p in self.processes if p.running)
                )
            if on_tick is not None:
                on_tick()
            time.sleep(WATCH_INTERVAL_S)

    def check(self) -> None:
        """Restart each process that died and may be restarted, give up on a worker the
        quorum does without; ``ProcessFailed`` for any other."""
        for index, p in enumerate(self.processes):
            code = p.returncode
            if code in (None, 0) or p.name in self.lost or p.name in self.after_end:
                continue
            if p.name.startswith("worker-") and restartable(code) and self.servers_finished():
                self.after_end.append(p.name)
                log.warning("%s exited with code %d after every server process finished "
                            "the run; not restarted", p.name, code)
            elif restartable(code) and self.restarts_of(p.name) < self.max_restarts:
                self.restart(index, code)
            elif self.can_lose(p.name, code):
                self.lost.append(p.name)
                log.warning("%s exited with code %d and is not restarted; the rounds go on "
                            "without it (quorum %d)", p.name, code, self.quorum)
            else:
                raise ProcessFailed(p.name, code, p.tail(), self.restarts_of(p.name))
        self.stop_stragglers(time.monotonic())

    def stop_stragglers(self, now: float) -> None:
        """Once every server process finished, stop the worker processes still running
        ``AFTER_END_GRACE_S`` later (SIGTERM, and SIGCONT so that a stopped one gets
        it; the cluster's ``stop_all`` SIGKILLs what is left once :meth:`watch` returns):
        the run's result is the servers'."""
        if not self.servers_finished():
            return
        if self.servers_done_at is None:
            self.servers_done_at = now
        waited = now - self.servers_done_at
        if waited < AFTER_END_GRACE_S:
            return
        for p in self.processes:
            if not (p.name.startswith("worker-") and p.running):
                continue
            if p.name not in self.after_end:
                self.after_end.append(p.name)
                log.warning("%s still runs %.0f s after every server process finished the "
                            "run; stopping it", p.name, waited)
                p.signal(signal.SIGTERM)
                p.signal(signal.SIGCONT)

    def restart(self, index: int, code: int) -> None:
        """Start process ``index`` again (it exited with ``code``)."""
        old = self.processes[index]
        self.processes[index] = self.respawn(old)
        seconds = round(time.monotonic() - self.started, 1)
        self.restarts.append({"process": old.name, "exit_code": code, "after_s": seconds})
        log.warning("%s exited with code %d; restarted it (restart %d of %d)", old.name, code,
                    self.restarts_of(old.name), self.max_restarts)

    def servers_finished(self) -> bool:
        """Every server process exited 0: the run is over."""
        servers = [p for p in self.processes if p.name.startswith("server-")]
        return bool(servers) and all(p.returncode == 0 for p in servers)

    def restarts_of(self, name: str) -> int:
        return sum(r["process"] == name for r in self.restarts)

    def can_lose(self, name: str, code: int) -> bool:
        """Worker process ``name`` died for good and the quorum does without its workers:
        with them, no more workers are lost than the started ones beyond the quorum."""
        if not (name.startswith("worker-") and restartable(code)):
            return False
        workers = sum(self.workers_of(p.name) for p in self.processes
                      if p.name.startswith("worker-"))
        lost = sum(self.workers_of(n) for n in self.lost if n.startswith("worker-"))
        return lost + self.workers_of(name) <= workers - self.quorum
