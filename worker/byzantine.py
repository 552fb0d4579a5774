"""Byzantine workers of the classic model: whole gradient vectors replaced.

A Byzantine worker is omniscient and colluding, the strongest classic
adversary: it recomputes the honest workers' gradients (their data partitions
and minibatch streams are derived from the public run seed), forges the
vectors of all Byzantine workers at once with a stream derived from
(seed, round), and sends its own row. Every Byzantine process thus forges the
same matrix, and the reference engine reproduces it exactly.

With worker momentum (``--worker-momentum``) the honest workers push their momentum
vectors, and a Byzantine worker forges from those: it keeps each honest worker's momentum
(:class:`ByzantineState`), fed with the gradients it recomputes every round. An attack
that searches its factor against the rule (``reads_rule``) gets an :class:`Aim` built
from the run configuration: :class:`ServerAggregation`, what the servers compute. A
label-flipping worker (``trains``) computes its own gradient of the flipped labels and
applies its own momentum, as an honest worker would. An attack that carries state from
round to round (``stateful``: the adaptive mimic) keeps it in the worker's
:class:`ByzantineState` too, one memory per Byzantine worker, updated each round it forges.

Momentum and an attack's memory are process state, held in memory: a worker restarted by
the launcher starts them again from zero, and a worker that catches up after missed rounds
keeps them (updated only in the rounds it computed). The reference engine assumes every
worker computed every round from the start: it reproduces runs without faults bit for
bit, and a faulty run with momentum or a stateful attack only if no worker restarted or
skipped a round.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from common.learn.attacks import VectorAttack
from common.learn.attacks.base import Aim
from common.learn.rules.defence import Defence
from common.learn.rules.pre import RoundContext
from common.net.sharding import shard_ranges
from common.run.config import AttackConfig, RunConfig
from worker.trainer import GradientComputer, Momentum


def honest_workers(cfg: RunConfig, attack: AttackConfig) -> list[int]:
    """The workers that compute honestly: all but the Byzantine ones (none without a
    worker attack, whatever ``--byzantine-workers`` lists)."""
    return [i for i in range(cfg.num_workers) if not attack.is_byzantine(i)]


def worker_attack(attack: AttackConfig) -> VectorAttack:
    """The Byzantine workers' attack, with its parameters."""
    # (a vector attack: only those strike at the workers)
    return cast(VectorAttack, attack.attack(attack.worker_attack))


class ServerAggregation:
    """What the run's servers compute from a round's (n, d) rows (ordered by worker id):
    on each shard's columns, the run's defence (the pre-aggregation chain, seeded by
    seed, round and shard, and the rule), concatenated. A stateful rule (centered
    clipping) starts from its initial state: the attacker does not know the servers'."""

    def __init__(self, cfg: RunConfig, d: int) -> None:
        self.cfg = cfg
        self.ranges = shard_ranges(d, cfg.num_shards)
        self.defence = Defence(cfg)

    def __call__(self, rows: np.ndarray, round_: int) -> np.ndarray:
        out = np.empty(rows.shape[1], dtype=np.float32)
        for s, (a, b) in enumerate(self.ranges):
            matrix = torch.from_numpy(np.ascontiguousarray(rows[:, a:b]))
            self.defence.set_state({})
            out[a:b] = self.defence(matrix, RoundContext(self.cfg.seed, round_, s)).numpy()
        return out


@functools.lru_cache(maxsize=4)
def server_aggregation(cfg: RunConfig, d: int) -> ServerAggregation:
    return ServerAggregation(cfg, d)


def aim(cfg: RunConfig, attack: AttackConfig, d: int, round_: int) -> Aim:
    """The run's aggregation at ``round_``, for an attack that searches against it."""
    servers = server_aggregation(cfg, d)
    return Aim(functools.partial(servers, round_=round_), tuple(attack.byzantine_workers))


def forge(cfg: RunConfig, attack: AttackConfig, honest: np.ndarray, round_: int,
          memory: Any = None) -> np.ndarray:
    """The (len(byzantine_workers), d) vectors the Byzantine workers send at ``round_``,
    from the honest workers' vectors (their momentum vectors, with worker momentum);
    ``memory``: a ``stateful`` attack's, of the worker forging (updated)."""
    impl = worker_attack(attack)
    extra: dict[str, Any] = {}
    if impl.reads_rule:
        extra["aim"] = aim(cfg, attack, honest.shape[1], round_)
    return impl.forge_at(honest, len(attack.byzantine_workers), cfg.num_workers, cfg.seed,
                         "worker-attack", round_, memory=memory, **extra)


@dataclass
class ByzantineState:
    """What a Byzantine worker carries from round to round: with worker momentum, the
    momentum of each honest worker, tracked from the gradients it recomputes (attacks
    that read the honest vectors), and its own (label flipping); a ``stateful`` attack's
    memory (None for the others)."""

    honest: dict[int, Momentum] = field(default_factory=dict)
    own: Momentum = field(default_factory=lambda: Momentum(0.0))
    memory: Any = None

    @classmethod
    def start(cls, cfg: RunConfig, attack: AttackConfig) -> ByzantineState:
        beta = cfg.worker_momentum
        impl = worker_attack(attack)
        return cls({i: Momentum(beta) for i in honest_workers(cfg, attack)}, Momentum(beta),
                   impl.start_memory() if impl.stateful else None)


def byzantine_gradient(
    cfg: RunConfig,
    attack: AttackConfig,
    computer: GradientComputer,
    x: np.ndarray,
    round_: int,
    worker: int,
    state: ByzantineState | None = None,
) -> np.ndarray:
    """What Byzantine ``worker`` pushes at ``round_`` after pulling parameters ``x``.

    ``state``: the worker's :class:`ByzantineState` from the rounds before (None: a fresh
    one, right without worker momentum or at round 0); updated here."""
    impl = worker_attack(attack)
    if state is None:
        state = ByzantineState.start(cfg, attack)
    if impl.trains:
        return state.own(computer.gradient(x, round_, worker, relabel=impl.relabel)[0])
    ids = honest_workers(cfg, attack)
    if impl.reads_honest:
        honest = np.stack([state.honest[i](computer.gradient(x, round_, i)[0]) for i in ids])
    else:  # only the shape is read
        honest = np.zeros((len(ids), computer.d), dtype=np.float32)
    # a copy: a view would keep the whole forged matrix alive while the push is kept
    forged = forge(cfg, attack, honest, round_, state.memory)
    return forged[attack.byzantine_workers.index(worker)].copy()
