"""One worker's round as a state machine: where a worker of a process stands, and what
moves it on. ``worker/run.py`` runs a process's workers through it; each exchange with
the server processes is ``worker/core.py``'s (its outcome, a ``NextRound``, is what a
transition reads).

::

    READY ──push──► PUSHING ──answered──► READY    x^{t+1} came (or, caught up, a later x)
      ▲                                ├► OWING    x^{t+1} came bare from some servers
      │                                └► DONE     past the last round
      │
      └──settle── OWING ──settle──► FILLING ──answered──► READY | DONE
         (borrowed from the lender's   (asks the servers for what it owes itself)
          place of that round)

READY: it holds x^t and computes and pushes round t next. PUSHING: its push of round t
is under way; the reply brings x^{t+1}. OWING: a bare PARAMS left some servers' slices of
x^{t+1} out (``NextRound.owed``): it takes them from its process's *lender* (the first
honest worker, which asks for the values) once the lender holds that round, or asks the
servers itself if the lender has gone past it or has not reached it within the grace.
FILLING: that request is under way. DONE: past the last round (or the last round closed
without it).
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass

from common.net.wire import to_wire
from common.run.buffers import HostBuffers
from common.run.config import RunConfig
from common.run.metrics import JsonlWriter
from worker.client import ClusterClient
from worker.core import NextRound
from worker.step import WorkerStep

log = logging.getLogger("ps.worker")


class Phase(enum.Enum):
    """Where a worker stands (see the module docstring)."""

    READY = "ready"
    PUSHING = "pushing"
    OWING = "owing"
    FILLING = "filling"
    DONE = "done"


@dataclass(frozen=True)
class _Pushed:
    """The push under way: its round, the loss and when computing began and ended."""

    round: int
    loss: float
    began: float
    computed: float


class WorkerRound:
    """One worker of this process: its step, its connections, its metrics, and its
    place (``at``: where it goes on; None while an exchange is under way) and phase."""

    def __init__(self, worker: int, step: WorkerStep, client: ClusterClient,
                 metrics: JsonlWriter, at: NextRound | None = None, bare: bool = False,
                 bits: HostBuffers | None = None) -> None:
        self.worker = worker
        self.step = step
        self.client = client
        self.metrics = metrics
        self.cfg: RunConfig = client.core.cfg
        self.bare = bare  # its pushes ask for bare PARAMS (it borrows the lender's values)
        self.bits = bits  # where its vectors' bfloat16 bits go (--wire-dtype)
        self.started_at = 0  # this process's first round: its momentum began there
        self.pushed: _Pushed | None = None  # PUSHING: its push
        self.filling = 0  # FILLING: the round whose owed values it asks the servers for
        self.owed_since = 0.0  # when it came to owe values (time.monotonic())
        self.at: NextRound | None = None
        self.phase = Phase.PUSHING
        if at is not None:
            self.place(at)

    @property
    def waiting(self) -> bool:
        """An exchange of its is under way (PUSHING or FILLING)."""
        return self.phase in (Phase.PUSHING, Phase.FILLING)

    def push(self) -> None:
        """READY -> PUSHING: compute round t from x^t and start pushing it."""
        if self.phase is not Phase.READY or self.at is None or self.at.params is None:
            return
        t = self.at.round
        began = time.perf_counter()
        g, loss = self.step(self.at.params, t)
        g = to_wire(g, self.cfg.wire_dtype, None if self.bits is None else self.bits.take())
        computed = time.perf_counter()
        # one exchange per server process: the reply to the push is x^{t+1}
        self.client.begin(lambda now: self.client.core.push(t, g, now, self.bare))
        self.at, self.phase = None, Phase.PUSHING
        self.pushed = _Pushed(t, loss, began, computed)

    def settle(self, lent: tuple[NextRound, ...], now: float, grace_s: float) -> None:
        """OWING -> READY: fill what its bare PARAMS left out from the lender's place of
        the same round (``lent``: its latest places, newest first); OWING -> FILLING: ask
        the servers if the lender has gone past that round, or has not reached it for
        ``grace_s`` seconds; else stay, the lender's exchange of that round under way."""
        at = self.at
        if self.phase is not Phase.OWING or at is None:
            return
        for place in lent:
            if place.round == at.round and place.params is not None:
                self.place(self.client.core.borrow(at, place.params))
                return
        latest = lent[0]
        past = latest.round > at.round or latest.params is None
        if past or now - self.owed_since > grace_s:
            if not past:
                log.warning("worker %d: no values of round %d from its process's first "
                            "worker in %.0f s; asking the servers", self.worker, at.round,
                            now - self.owed_since)
            self.client.begin(lambda now: self.client.core.pull_owed(at, now))
            self.at, self.phase, self.filling = None, Phase.FILLING, at.round

    def answered(self) -> None:
        """PUSHING or FILLING -> READY, OWING or DONE: its exchange is over; go on where it
        says, having recorded the round it pushed."""
        at = self.client.core.outcome
        if not isinstance(at, NextRound):
            raise TypeError(f"a worker's exchange ended with {type(at).__name__}")
        if self.phase is Phase.PUSHING:
            self._record_push(at)
        elif self.phase is Phase.FILLING and at.missed:
            log.warning("worker %d: round %d was gone when it pulled it; caught up at "
                        "round %d", self.worker, self.filling, at.round)
        self.place(at)

    def _record_push(self, at: NextRound) -> None:
        """Its push is answered: the round's metrics line, or why it has none."""
        pushed, self.pushed = self.pushed, None
        if pushed is None:
            raise RuntimeError("a push answered that was never sent")
        if at.missed:
            if at.round >= self.cfg.rounds:
                log.warning("worker %d: the last round closed without it; the run is over",
                            self.worker)
            else:
                log.warning("worker %d: round %d closed without it (a server is at round "
                            "%d); caught up", self.worker, pushed.round, at.round)
            return
        self.metrics.write({
            "round": pushed.round, "loss": pushed.loss,
            "compute_ms": (pushed.computed - pushed.began) * 1e3,
            "exchange_ms": (time.perf_counter() - pushed.computed) * 1e3,
            "started_at": self.started_at,
        })
        if pushed.round % 100 == 0:
            log.info("worker %d round %d loss %.4f", self.worker, pushed.round, pushed.loss)

    def place(self, at: NextRound) -> None:
        """Go on from ``at``: DONE past the last round, OWING with values owed, else
        READY."""
        self.at = at
        if at.round >= self.cfg.rounds or at.params is None:
            self.phase = Phase.DONE
        elif at.owed:
            self.phase, self.owed_since = Phase.OWING, time.monotonic()
        else:
            self.phase = Phase.READY
