"""The reference engine: the same training as a cluster, in one process, no sockets.

It drives the very components the processes use (each worker's ``WorkerStep``,
``ShardCorruptor``, ``ShardGroup``) in the order the
cluster's data flows, so for the same ``RunConfig`` and ``AttackConfig`` it
ends with parameters bit-identical to a multi-process run (compare
``params_digest``). Given the participation a run recorded (rounds closed at their
deadline without some workers), it aggregates exactly the pushes that run did. It is
also the fast path for parameter sweeps: the workers whose PARAMS no proxy replaced
pull one vector (loaded into the model once a round), and with a coordinate-wise defence
the consecutive shards no proxy fronts are hosted as one server process would host them
(one rule call, bit for bit the shards' own); the honest workers that pulled alike
compute their gradients in one batched call (``ps/reference/batched.py``, bit for bit
each worker's own).

Worker momentum (``--worker-momentum``) is kept per worker as the worker processes keep
it, every worker computing every round from round 0: a run without faults is reproduced
bit for bit; a worker process that restarted (its momentum starts again at 0) or skipped
rounds is not modelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from common.errors import ConfigError
from common.learn.data import Dataset, run_dataset
from common.learn.rules.defence import Defence
from common.net.sharding import shard_ranges
from common.net.wire import FLOAT32, round_to_wire
from common.run.buffers import HostBuffers
from common.run.config import AttackConfig, RunConfig
from common.run.model_init import initial_parameters
from common.run.process import check_stop
from ps.proxy.corruption import ShardCorruptor
from ps.reference.batched import BatchedGradients
from ps.reference.participation import Participation
from server.checkpoint import params_digest
from server.group import ShardGroup
from server.shard import RoundMetrics
from worker.byzantine import forge, honest_workers, worker_attack
from worker.step import WorkerStep
from worker.trainer import GradientComputer


@dataclass
class SimulationResult:
    """Final parameters and what happened on the way."""

    params: np.ndarray
    rounds: int
    seconds: float
    corrupted_values: int

    @property
    def digest(self) -> str:
        return params_digest(self.params)


class Simulation:
    """Synchronous rounds of the whole system in one process."""

    def __init__(self, cfg: RunConfig, attack: AttackConfig, dataset: Dataset,
                 participation: Participation | None = None,
                 device: torch.device | None = None, batched: bool = True) -> None:
        self.cfg = cfg
        self.attack = attack
        self.participation = participation or Participation()
        self.computer = GradientComputer(cfg, dataset, device)
        x0 = initial_parameters(cfg)
        self.ranges = shard_ranges(x0.size, cfg.num_shards)
        self.corruptors = {
            s: ShardCorruptor(cfg, attack, s, *self.ranges[s])
            for s in attack.proxy_shards
            if attack.proxy_attack != "none"
        }
        # the shards as server processes host them: pushed and stepped as the servers do
        self.groups = [ShardGroup(cfg, shards, x0) for shards in self._hosting()]
        self.shards = [state for group in self.groups for state in group.states]
        # where each group's shards lie in a worker's vector (consecutive shards)
        self.spans = [(self.ranges[g.shards[0]][0], self.ranges[g.shards[-1]][1])
                      for g in self.groups]
        self.corrupted_values = 0
        self.last_metrics: list[RoundMetrics] = []  # each shard's step in the last round
        # each worker's step, as its process runs it: an honest worker's momentum; a
        # Byzantine worker's state (its own momentum, and, once it tracks them itself,
        # the honest workers' it recomputes)
        # their pushed vectors are written into reused host vectors, as in a worker process
        vectors = HostBuffers(self.computer.d)
        self.workers = [WorkerStep(cfg, attack, self.computer, i, vectors)
                        for i in range(cfg.num_workers)]
        # the honest workers' gradients in one call where they pulled alike, bit for bit
        # each worker's own (``ps/reference/batched.py``); ``batched=False``: one by one
        self.batched = (BatchedGradients(self.computer) if batched and
                        BatchedGradients.supports(self.computer, cfg.num_workers) else None)
        # with bfloat16 on the wire: the pushes as the servers widen them, and the bits
        self.wired = HostBuffers(self.computer.d)
        self.bits = HostBuffers(self.computer.d, dtype=np.uint16)
        self.tracking: set[int] = set()

    def params(self) -> np.ndarray:
        return np.concatenate([s.params for s in self.shards])

    def broken(self) -> bool:
        """Whether every parameter is NaN (an attack that won): from here no round can
        change a bit of them (``simulate``'s ``settle_broken``)."""
        return (all(np.isnan(s.params[0]) for s in self.shards)
                and all(bool(np.isnan(s.params).all()) for s in self.shards))

    def _hosting(self) -> list[list[int]]:
        """The shards of each server process modelled, in shard order: one shard a
        process; with a coordinate-wise defence and every worker in every round, each run
        of consecutive shards that no proxy stands in front of is one process (one rule
        call for all, bit for bit each shard's own: ``server/group.py``)."""
        if not Defence(self.cfg).coordinatewise or self.participation.partial:
            return [[s] for s in range(self.cfg.num_shards)]
        hosted: list[list[int]] = []
        for s in range(self.cfg.num_shards):
            if s in self.corruptors or not hosted or hosted[-1][-1] in self.corruptors:
                hosted.append([s])
            else:
                hosted[-1].append(s)
        return hosted

    def step(self) -> list[RoundMetrics]:
        """Run one round: every worker pulls, computes, pushes; every shard steps."""
        t = self.shards[0].round
        n = self.cfg.num_workers
        views = self._pulled(t)
        grads: dict[int, np.ndarray] = {}  # each worker's vector, by id (all n below)
        byzantine = [i for i in range(n) if self.attack.is_byzantine(i)]
        honest = honest_workers(self.cfg, self.attack)
        # a Byzantine worker that pulled what the honest workers pulled, and has always
        # seen their very vectors, reuses them instead of recomputing them
        trains = bool(byzantine) and worker_attack(self.attack).trains
        shortcut = {i: not trains and i not in self.tracking
                    and self._pulled_alike(views, i, honest) for i in byzantine}
        for i in byzantine:
            if not (shortcut[i] or trains or i in self.tracking) and self.cfg.worker_momentum:
                # from now on it keeps the honest workers' momentum itself, from theirs
                # (as they were before this round's step)
                state = self.workers[i].state
                if state is None:  # (a Byzantine worker's)
                    raise RuntimeError(f"worker {i} is Byzantine but has no attack state")
                state.honest = {j: self.workers[j].momentum.copy() for j in honest}
                self.tracking.add(i)
        batched = (self.batched if self.batched is not None and honest
                   and self._pulled_alike(views, honest[0], honest) else None)
        outs = [] if batched is None else [self.workers[i].vector() for i in honest]
        if batched is not None and batched.gradients(views[honest[0]], t, honest, outs):
            for i, out in zip(honest, outs, strict=True):
                grads[i] = self.workers[i].push(out)
        else:
            for i in honest:
                grads[i] = self.workers[i](views[i], t)[0]
        # a stateful attack forges with each worker's own memory, as in its process
        stateful = bool(byzantine) and worker_attack(self.attack).stateful
        rows = None  # the honest vectors, for the Byzantine workers that pulled alike
        forged = None  # the matrix every Byzantine worker that pulled alike forges
        for i in byzantine:
            if shortcut[i]:
                if rows is None:
                    rows = np.stack([grads[j] for j in honest])
                if forged is None or stateful:
                    forged = forge(self.cfg, self.attack, rows, t,
                                   self._memory(i) if stateful else None)
                grads[i] = forged[self.attack.byzantine_workers.index(i)]
            else:
                grads[i] = self.workers[i](views[i], t)[0]
        # each worker sends its vector as --wire-dtype: rounded there (after the forgers
        # read the honest vectors, which they recompute unrounded)
        wired = [self._wire(grads[i]) for i in range(n)]
        metrics = []
        for group, (a, b) in zip(self.groups, self.spans, strict=True):
            s = group.first  # (a group of several: all n workers, no proxy)
            pushes = [g[a:b] for g in wired]
            corruptor = self.corruptors.get(s)
            aggregated = self.participation.workers(s, t, n)
            if corruptor is not None:
                if corruptor.whole_round and len(aggregated) < n:
                    raise ConfigError(f"shard {s} closed round {t} without workers; the "
                                      f"proxy attack {self.attack.proxy_attack} needs all n")
                pushes = self._corrupt_pushes(corruptor, t, pushes, aggregated)
            for i in aggregated:
                group.push(t, i, pushes[i])
            metrics += [m for _, m in group.step()]
        self.last_metrics = metrics
        return metrics

    def _memory(self, worker: int) -> object:
        """Byzantine ``worker``'s attack memory (its state's, which its step would update)."""
        state = self.workers[worker].state
        if state is None:  # (a Byzantine worker's)
            raise RuntimeError(f"worker {worker} is Byzantine but has no attack state")
        return state.memory

    def _wire(self, values: np.ndarray) -> np.ndarray:
        """``values`` as a server receives them (rounded to --wire-dtype; a whole vector
        into reused ones, a shard's slice, as a proxy forwards it, into new ones)."""
        if self.cfg.wire_dtype == FLOAT32:
            return values
        whole = values.size == self.wired.length
        return round_to_wire(values, self.cfg.wire_dtype,
                             self.wired.take() if whole else None,
                             self.bits.take() if whole else None)

    @staticmethod
    def _pulled_alike(views: list[np.ndarray], worker: int, others: list[int]) -> bool:
        """Whether ``worker`` pulled bit for bit what each of ``others`` did (no proxy
        corrupted the PARAMS differently): the very same vector, or equal values."""
        return all(views[worker] is views[j] or np.array_equal(views[worker], views[j])
                   for j in others)

    def _pulled(self, t: int) -> list[np.ndarray]:
        """x^t as each worker receives it (PARAMS may be corrupted by a proxy): one new
        vector shared by the workers whose PARAMS no proxy replaced (loaded into the
        model once), a vector of its own for each other worker. Never written to."""
        own = [shard.params for shard in self.shards]
        shared = np.concatenate(own)
        views = []
        for worker in range(self.cfg.num_workers):
            parts = list(own)
            for s, corruptor in self.corruptors.items():
                parts[s], changed = corruptor.corrupt_params(t, worker, own[s])
                self.corrupted_values += changed
            alike = all(p is o for p, o in zip(parts, own, strict=True))
            views.append(shared if alike else np.concatenate(parts))
        return views

    def _corrupt_pushes(
        self, corruptor: ShardCorruptor, t: int, pushes: list[np.ndarray],
        aggregated: tuple[int, ...],
    ) -> list[np.ndarray]:
        """The pushes as the proxy forwards them (those aggregated are the ones counted),
        rounded to --wire-dtype as it sends them."""
        if corruptor.whole_round:
            out, changed = corruptor.corrupt_round(t, pushes)
            self.corrupted_values += changed
            return [self._wire(p) for p in out]
        out = list(pushes)
        for i in aggregated:
            corrupted, changed = corruptor.corrupt_push(t, i, pushes[i])
            out[i] = self._wire(corrupted)
            self.corrupted_values += changed
        return out


def simulate(
    cfg: RunConfig,
    attack: AttackConfig,
    dataset: Dataset | None = None,
    data_dir: str | None = None,
    on_round: Callable[[int, Simulation], None] | None = None,
    participation: Participation | None = None,
    device: torch.device | None = None,
    settle_broken: bool = False,
) -> SimulationResult:
    """Run ``cfg.rounds`` rounds (aggregating the recorded ``participation``, default all
    n every round) on ``dataset`` (default the run's, ``run_dataset``: what its workers
    load), the workers' gradients on ``device`` (default the CPU); ``on_round(t, sim)`` is
    called after each round.

    ``settle_broken`` (the grids' runs, which keep only evaluations and the final digest):
    once every parameter is NaN, the remaining rounds are not computed, only reported to
    ``on_round``. They could not change a bit: a shard steps x - lr_t * g with x first,
    and IEEE arithmetic returns its NaN operand, x's own, whatever g is
    (``test_a_broken_run_settles_bit_for_bit``); ``corrupted_values`` then counts the
    rounds computed. A quarter of the paper grid's runs are NaN by round 25."""
    dataset = dataset or run_dataset(cfg, data_dir)
    sim = Simulation(cfg, attack, dataset, participation, device)
    started = time.perf_counter()
    settled = False
    for t in range(cfg.rounds):
        check_stop()
        if not settled:
            sim.step()
            settled = settle_broken and sim.broken()
        if on_round is not None:
            on_round(t + 1, sim)
    return SimulationResult(
        params=sim.params(),
        rounds=cfg.rounds,
        seconds=time.perf_counter() - started,
        corrupted_values=sim.corrupted_values,
    )
