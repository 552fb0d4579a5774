"""The worker loop: pull x^t from every shard, compute the round's vector
(``worker/step.py``: the gradient, the momentum vector with ``--worker-momentum``, or a
Byzantine worker's forged row; ``worker/byzantine.py`` says what happens to momentum
when a worker restarts or catches up), push its shards and get x^{t+1} back
(``worker/client.py``; a round that closed without this worker is caught up there).

One process runs one worker or several (``--worker-id 0-9``). Each keeps everything a
worker process has: its key and connections (``ClusterClient``), its step state, its
replay window and its ``worker-<i>.jsonl``; they share the dataset and one model, on
which they compute one after the other. A worker whose exchange is answered computes its
next round while the others still wait for theirs, honest workers before Byzantine ones;
all wait on one poll. x^{t+1} is the same for every worker, so only the first (the
*lender*: the first honest worker) receives its values: the others' pushes ask for bare
PARAMS, and each takes the values from the lender's reply of that round
(``_Member.settle``), or asks the servers for them itself if the lender has gone past
that round (it missed one at a deadline, or finished) or has not reached it within
``BORROW_GRACE`` of the request timeout (its reply was lost, a server restarted). The
run is the same as with a process per worker (bit-identical): a process is a deployment
choice, as a server process hosting several shards is. The process is the unit of
failure: an error of one worker ends it, and a supervisor restarts all its workers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.buffers import HostBuffers
from common.config import AttackConfig, RunConfig
from common.data import load_dataset
from common.errors import ConfigError
from common.keys import KeyRing
from common.metrics import JsonlWriter
from common.process import check_stop, freeze_startup_objects
from common.wire import BFLOAT16, to_wire
from worker.client import ClusterClient, exchange_all, poll_clients, reserve_links
from worker.core import NextRound, RetryPolicy
from worker.device import describe, resolve_device
from worker.options import ClientOptions
from worker.step import WorkerStep
from worker.trainer import GradientComputer

log = logging.getLogger("ps.worker")

# A worker waits for its lender's values at most this fraction of --timeout.
BORROW_GRACE = 0.25


@dataclass
class _Member:
    """One worker of this process and where it stands."""

    worker: int
    step: WorkerStep
    client: ClusterClient
    metrics: JsonlWriter
    at: NextRound | None = None  # where it goes on; None while its push is under way
    bare: bool = False  # its pushes ask for bare PARAMS (it borrows the lender's values)
    started_at: int = 0  # this process's first round: its momentum began there
    # its push under way: round, loss, times (None: the exchange under way pulls what a
    # bare PARAMS left out, of the round ``filling``)
    pushed: tuple[int, float, float, float] | None = None
    filling: int = 0
    owed_since: float = 0.0  # when its exchange ended owing values (time.monotonic())
    bits: HostBuffers | None = None  # where its vectors' bfloat16 bits go (--wire-dtype)

    def push(self, cfg: RunConfig) -> None:
        """Compute and start pushing its next round, if it has one."""
        at = self.at
        if at is None or at.owed or at.round >= cfg.rounds:  # (owed: see settle)
            return
        t = at.round
        began = time.perf_counter()
        g, loss = self.step(at.params, t)  # type: ignore[arg-type]
        g = to_wire(g, cfg.wire_dtype, None if self.bits is None else self.bits.take())
        computed = time.perf_counter()
        # one exchange per server process: the reply to the push is x^{t+1}
        self.client.begin(lambda now: self.client.core.push(t, g, now, self.bare))
        self.at = None
        self.pushed = (t, loss, began, computed)

    def settle(self, lent: tuple[NextRound, ...], now: float, grace_s: float) -> None:
        """Fill what its bare PARAMS left out from the lender's place of the same round
        (``lent``: its latest places, newest first); ask the servers if the lender has
        gone past that round, or has not reached it for ``grace_s`` seconds."""
        at = self.at
        if at is None or not at.owed:
            return
        for place in lent:
            if place.round == at.round and place.params is not None:
                self.at = self.client.core.borrow(at, place.params)
                return
        latest = lent[0]
        past = latest.round > at.round or latest.params is None
        if past or now - self.owed_since > grace_s:
            if not past:
                log.warning("worker %d: no values of round %d from its process's first "
                            "worker in %.0f s; asking the servers", self.worker, at.round,
                            now - self.owed_since)
            self.client.begin(lambda now: self.client.core.pull_owed(at, now))
            self.at, self.filling = None, at.round
        # else the lender's exchange of that round is still under way: wait for it

    def answered(self, cfg: RunConfig) -> None:
        """Its exchange is over: go on where it says, and record the round it pushed."""
        at: NextRound = self.client.core.outcome  # type: ignore[assignment]
        self.at = at
        self.owed_since = time.monotonic()
        if self.pushed is None:  # it pulled what it owed; its round was recorded
            if at.missed:
                log.warning("worker %d: round %d was gone when it pulled it; caught up at "
                            "round %d", self.worker, self.filling, at.round)
            return
        t, loss, began, computed = self.pushed
        self.pushed = None
        if at.missed:
            if at.round >= cfg.rounds:
                log.warning("worker %d: the last round closed without it; the run is over",
                            self.worker)
            else:
                log.warning("worker %d: round %d closed without it (a server is at round "
                            "%d); caught up", self.worker, t, at.round)
            return
        self.metrics.write({
            "round": t, "loss": loss, "compute_ms": (computed - began) * 1e3,
            "exchange_ms": (time.perf_counter() - computed) * 1e3,
            "started_at": self.started_at,
        })
        if t % 100 == 0:
            log.info("worker %d round %d loss %.4f", self.worker, t, loss)


def run_worker(cfg: RunConfig, attack: AttackConfig, options: ClientOptions,
               out_dir: Path | None, keys: KeyRing | None = None) -> None:
    """Train as the workers of ``options.worker_id`` until the last round (or resume where
    the servers are)."""
    workers = options.worker_ids(cfg.num_workers)
    servers = options.server_list(cfg.num_shards)
    # worker processes of one host spread over its GPUs by their place among the blocks
    device = resolve_device(options.device, slot=workers[0] // len(workers))
    dataset = load_dataset(cfg.dataset, options.data_dir, seed=cfg.seed)
    computer = GradientComputer(cfg, dataset, device)
    policy = RetryPolicy(timeout_s=options.timeout_s, retries=options.retries)
    reserve_links(len(workers) * len(servers))
    # the vectors pushed and the parameters received: host vectors reused round after
    # round by all the process's workers (pinned for a GPU's copies)
    pushed = HostBuffers(computer.d, pinned=device.type == "cuda")
    received = HostBuffers(computer.d, pinned=device.type == "cuda")
    bits = (HostBuffers(computer.d, dtype=np.uint16) if cfg.wire_dtype == BFLOAT16
            else None)
    # kept in memory from round to round: a restarted worker starts again from zero
    team = [_Member(w, WorkerStep(cfg, attack, computer, w, pushed),
                    ClusterClient(servers, cfg, "worker", w, policy, keys,
                                  replay_rounds=options.replay_window(computer.d),
                                  vectors=received, via_proxy=options.via_proxy,
                                  d=computer.d),
                    JsonlWriter(out_dir / f"worker-{w}.jsonl" if out_dir else None),
                    bits=bits)
            for w in workers]
    # honest workers compute first: an attack (some compute every honest gradient) never
    # delays an honest push of its process (the order changes no result)
    team.sort(key=lambda m: m.step.byzantine)
    try:
        welcomed = exchange_all([(m.client, m.client.core.hello) for m in team])
        for m, welcomes in zip(team, welcomed, strict=True):
            if m.client.d != computer.d:
                raise ConfigError(f"servers hold d={m.client.d} parameters, this worker's "
                                  f"model has {computer.d}")
            m.started_at = min(w.round for w in welcomes)  # type: ignore[attr-defined]
            log.info("worker %d of %d%s: %d shards on %d servers, d=%d, on %s, starting at "
                     "round %d", m.worker, cfg.num_workers,
                     f" (byzantine: {attack.worker_attack})" if m.step.byzantine else "",
                     cfg.num_shards, len(servers), computer.d, describe(device),
                     m.started_at)
        starts = [(m.client, lambda now, m=m: m.client.core.catch_up(m.started_at, now))
                  for m in team]
        for m, at in zip(team, exchange_all(starts), strict=True):
            m.at = at  # type: ignore[assignment]
        lender, borrowers = team[0], team[1:]
        lent: tuple[NextRound, ...] = (lender.at,)  # type: ignore[assignment]
        grace_s = BORROW_GRACE * options.timeout_s
        for m in borrowers:
            m.bare = True
        freeze_startup_objects()
        while True:
            check_stop()
            now = time.monotonic()
            for m in borrowers:
                m.settle(lent, now, grace_s)
            for m in team:
                m.push(cfg)
            waiting = [m for m in team if m.at is None]
            if not waiting:
                break
            poll_clients([m.client for m in waiting])
            for m in waiting:
                if not m.client.busy:
                    m.answered(cfg)
            if lender.at is not None and lender.at is not lent[0]:
                lent = (lender.at, lent[0])  # its last two places
        log.info("done after %d rounds (host vectors of d values allocated: %d for the "
                 "pushes, %d for the parameters)", cfg.rounds, pushed.allocated,
                 received.allocated)
    finally:
        for m in team:
            m.client.close()
            m.metrics.close()

