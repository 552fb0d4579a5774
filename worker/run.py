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
(``worker/round.py``: each worker's round is a state machine, READY, PUSHING, OWING,
FILLING, DONE), or asks the servers for them itself if the lender has gone past that
round (it missed one at a deadline, or finished) or has not reached it within
``BORROW_GRACE`` of the request timeout (its reply was lost, a server restarted). The
run is the same as with a process per worker (bit-identical): a process is a deployment
choice, as a server process hosting several shards is. The process is the unit of
failure: an error of one worker ends it, and a supervisor restarts all its workers.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from common.errors import ConfigError
from common.learn.data import run_dataset
from common.net.keys import KeyRing
from common.net.wire import BFLOAT16
from common.run.buffers import HostBuffers
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import JsonlWriter
from common.run.process import check_stop, freeze_startup_objects
from worker.client import ClusterClient, exchange_all, poll_clients, reserve_links
from worker.core import NextRound, RetryPolicy
from worker.device import describe, resolve_device
from worker.options import ClientOptions
from worker.round import WorkerRound
from worker.step import WorkerStep
from worker.trainer import GradientComputer

log = logging.getLogger("ps.worker")

# A worker waits for its lender's values at most this fraction of --timeout.
BORROW_GRACE = 0.25


def run_worker(cfg: RunConfig, attack: AttackConfig, options: ClientOptions,
               out_dir: Path | None, keys: KeyRing | None = None) -> None:
    """Train as the workers of ``options.worker_id`` until the last round (or resume where
    the servers are)."""
    workers = options.worker_ids(cfg.num_workers)
    servers = options.server_list(cfg.num_shards)
    # worker processes of one host spread over its GPUs by their place among the blocks
    device = resolve_device(options.device, slot=workers[0] // len(workers))
    dataset = run_dataset(cfg, options.data_dir)
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
    team = [WorkerRound(w, WorkerStep(cfg, attack, computer, w, pushed),
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
            if not isinstance(welcomes, list):
                raise TypeError(f"a HELLO exchange ended with {type(welcomes).__name__}")
            m.started_at = min(w.round for w in welcomes)
            log.info("worker %d of %d%s: %d shards on %d servers, d=%d, on %s, starting at "
                     "round %d", m.worker, cfg.num_workers,
                     f" (byzantine: {attack.worker_attack})" if m.step.byzantine else "",
                     cfg.num_shards, len(servers), computer.d, describe(device),
                     m.started_at)
        starts = [(m.client, lambda now, m=m: m.client.core.catch_up(m.started_at, now))
                  for m in team]
        for m, at in zip(team, exchange_all(starts), strict=True):
            if not isinstance(at, NextRound):
                raise TypeError(f"catching up ended with {type(at).__name__}")
            m.place(at)
        lender, borrowers = team[0], team[1:]
        lent: tuple[NextRound, ...] = (at_start(lender),)
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
                m.push()
            waiting = [m for m in team if m.waiting]
            if not waiting:
                break
            poll_clients([m.client for m in waiting])
            for m in waiting:
                if not m.client.busy:
                    m.answered()
            if lender.at is not None and lender.at is not lent[0]:
                lent = (lender.at, lent[0])  # its last two places
        log.info("done after %d rounds (host vectors of d values allocated: %d for the "
                 "pushes, %d for the parameters)", cfg.rounds, pushed.allocated,
                 received.allocated)
    finally:
        for m in team:
            m.client.close()
            m.metrics.close()


def at_start(m: WorkerRound) -> NextRound:
    """Where ``m`` goes on after catching up (it holds a place: no exchange under way)."""
    if m.at is None:
        raise RuntimeError(f"worker {m.worker} has no place after catching up")
    return m.at
