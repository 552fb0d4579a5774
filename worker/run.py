"""The worker loop: pull x^t from every shard, compute the round's vector
(``worker/step.py``: the gradient, the momentum vector with ``--worker-momentum``, or a
Byzantine worker's forged row; ``worker/byzantine.py`` says what happens to momentum
when a worker restarts or catches up), push its shards and get x^{t+1} back
(``worker/client.py``; a round that closed without this worker is caught up there)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from common.config import AttackConfig, RunConfig
from common.data import load_dataset
from common.errors import ConfigError
from common.keys import KeyRing
from common.metrics import JsonlWriter
from common.process import check_stop, freeze_startup_objects
from worker.client import ClusterClient
from worker.core import RetryPolicy
from worker.options import ClientOptions
from worker.step import WorkerStep
from worker.trainer import GradientComputer

log = logging.getLogger("ps.worker")


def run_worker(cfg: RunConfig, attack: AttackConfig, options: ClientOptions,
               out_dir: Path | None, keys: KeyRing | None = None) -> None:
    """Train as worker ``options.worker_id`` until the last round (or resume where the
    servers are)."""
    worker = options.worker_id
    if worker is None or not 0 <= worker < cfg.num_workers:
        raise ConfigError(f"--worker-id must be in 0..{cfg.num_workers - 1}, got {worker}")
    servers = options.server_list(cfg.num_shards)
    dataset = load_dataset(cfg.dataset, options.data_dir, seed=cfg.seed)
    computer = GradientComputer(cfg, dataset)
    # kept in memory from round to round: a restarted worker starts again from zero
    step = WorkerStep(cfg, attack, computer, worker)
    policy = RetryPolicy(timeout_s=options.timeout_s, retries=options.retries)
    client = ClusterClient(servers, cfg, "worker", worker, policy, keys,
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
            "worker %d of %d%s: %d shards on %d servers, d=%d, starting at round %d",
            worker, cfg.num_workers,
            f" (byzantine: {attack.worker_attack})" if step.byzantine else "",
            cfg.num_shards, len(servers), client.d, start,
        )
        at = client.catch_up(start)
        freeze_startup_objects()
        while at.round < cfg.rounds:
            check_stop()
            t = at.round
            began = time.perf_counter()
            g, loss = step(at.params, t)  # type: ignore[arg-type]
            computed = time.perf_counter()
            # one exchange per shard: the reply to the push is x^{t+1}
            at = client.push(t, g)
            if at.missed:
                if at.round >= cfg.rounds:
                    log.warning("the last round closed without this worker; the run is over")
                else:
                    log.warning("round %d closed without this worker (a server is at round "
                                "%d); caught up", t, at.round)
                continue
            done = time.perf_counter()
            metrics.write({
                "round": t, "loss": loss, "compute_ms": (computed - began) * 1e3,
                "exchange_ms": (done - computed) * 1e3,
                "started_at": start,  # this process's first round: its momentum began there
            })
            if t % 100 == 0:
                log.info("round %d loss %.4f", t, loss)
        log.info("done after %d rounds", cfg.rounds)
    finally:
        client.close()
        metrics.close()
