"""The worker loop: pull x^t from every shard, compute a gradient, push its shards (with
``--worker-momentum``, the momentum vector instead: see ``worker/byzantine.py``, which
also says what happens to it when a worker restarts or catches up)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from common.config import AttackConfig, RunConfig
from common.data import load_dataset
from common.errors import ConfigError
from common.keys import KeyRing
from common.metrics import JsonlWriter
from common.process import check_stop, freeze_startup_objects
from common.protocol import ErrorCode
from worker.byzantine import ByzantineState, Momentum, byzantine_gradient
from worker.client import ClusterClient, RetryPolicy, ServerRefused
from worker.options import ClientOptions
from worker.trainer import GradientComputer

log = logging.getLogger("ps.worker")


def run_worker(cfg: RunConfig, attack: AttackConfig, options: ClientOptions,
               out_dir: Path | None, keys: KeyRing | None = None) -> None:
    """Train as worker ``options.worker_id`` until the last round (or resume where the
    servers are)."""
    worker = options.worker_id
    if worker is None or not 0 <= worker < cfg.num_workers:
        raise ConfigError(f"--worker-id must be in 0..{cfg.num_workers - 1}, got {worker}")
    endpoints = options.endpoints()
    dataset = load_dataset(cfg.dataset, options.data_dir, seed=cfg.seed)
    computer = GradientComputer(cfg, dataset)
    byzantine = attack.is_byzantine(worker)
    # kept in memory from round to round: a restarted worker starts again from zero
    momentum = Momentum(cfg.worker_momentum)
    state = ByzantineState.start(cfg, attack) if byzantine else None
    policy = RetryPolicy(timeout_s=options.timeout_s, retries=options.retries)
    client = ClusterClient(endpoints, cfg, "worker", worker, policy, keys,
                           replay_rounds=options.replay_rounds)
    metrics = JsonlWriter(out_dir / f"worker-{worker}.jsonl" if out_dir else None)
    try:
        welcomes = client.hello()
        if client.d != computer.d:
            raise ConfigError(
                f"servers hold d={client.d} parameters, this worker's model has {computer.d}"
            )
        start = min(w.round for w in welcomes)
        log.info(
            "worker %d of %d%s: %d shards, d=%d, starting at round %d",
            worker, cfg.num_workers,
            f" (byzantine: {attack.worker_attack})" if byzantine else "",
            len(endpoints), client.d, start,
        )
        t, x = catch_up(client, start)
        freeze_startup_objects()
        while t < cfg.rounds:
            check_stop()
            began = time.perf_counter()
            if byzantine:
                g = byzantine_gradient(cfg, attack, computer, x, t, worker, state=state)
                loss = float("nan")
            else:
                g, loss = computer.gradient(x, t, worker)
                g = momentum(g)
            computed = time.perf_counter()
            # one exchange per shard: the reply to the push is x^{t+1}; a server that
            # restarted and lost the push gets it again before a fallback PULL is resent
            try:
                x = client.push(t, g, pull_next=t + 1 < cfg.rounds,
                                before_resend=lambda s, t=t, g=g: client.repush(s, t, g))
            except ServerRefused as exc:
                if exc.code != ErrorCode.STALE_ROUND.value:
                    raise
                if exc.round >= cfg.rounds:
                    log.warning("the last round closed without this worker; the run is over")
                    break
                log.warning("round %d closed without this worker (a server is at round %d); "
                            "catching up", t, exc.round)
                t, x = catch_up(client, exc.round)
                continue
            done = time.perf_counter()
            metrics.write({
                "round": t, "loss": loss, "compute_ms": (computed - began) * 1e3,
                "exchange_ms": (done - computed) * 1e3,
                "started_at": start,  # this process's first round: its momentum began there
            })
            if t % 100 == 0:
                log.info("round %d loss %.4f", t, loss)
            t += 1
        log.info("done after %d rounds", cfg.rounds)
    finally:
        client.close()
        metrics.close()


def catch_up(client: ClusterClient, round_: int) -> tuple[int, np.ndarray]:
    """(t, x^t) for the first round t >= ``round_`` that every shard still serves: a
    worker that starts late, or whose push came after its round closed, goes on there."""
    while True:
        check_stop()
        try:
            return round_, client.pull(round_)
        except ServerRefused as exc:
            if exc.code != ErrorCode.STALE_ROUND.value or exc.round <= round_:
                raise
            round_ = exc.round
