"""State of one model shard and its synchronous round step (no sockets).

Round t of shard s (paper, Section 2):  x_s^{t+1} = x_s^t - lr_t * Aggr({g_{i,s}^t : i in [n]}),
with the n gradient shards ordered by worker id and Aggr the configured rule,
applied locally and coordinate-wise (lr_t: ``--lr``, constant as in the paper unless
``--lr-milestones`` steps it down), after the configured pre-aggregation chain
(``--pre``, ``common.learn.rules.pre``; seeded by (seed, round, shard)): the run's
``Defence``. A round closed at its deadline aggregates the m < n rows it has (still
ordered by worker id) with the chain and the rule built for m rows; which workers each
round aggregated is its participation, kept with the parameters. A stateful rule's
state (centered clipping: the previous aggregate) is kept by the defence between
rounds, whichever rows ran the round, and saved with the checkpoint.

The server's core (``server/core.py``) and the in-process reference engine
(``ps/reference/engine.py``, which can replay a recorded participation) both drive this
class, which is what makes their results bit-identical.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from common.errors import ConfigError
from common.learn.rules import RuleError
from common.learn.rules.defence import Defence
from common.learn.rules.kernels.reductions import nonfinite_counts
from common.learn.rules.pre import RoundContext
from common.net.protocol import ErrorCode, Refused
from common.run.buffers import HostBuffers
from common.run.config import RunConfig

# Rounds of parameters kept so that a lagging reader (the evaluator) gets a
# consistent snapshot of round t from every shard.
HISTORY_ROUNDS = 4


@dataclass(frozen=True)
class RoundMetrics:
    """What one aggregation step did (one JSON line of the server's metrics)."""

    round: int
    aggregation_ms: float
    nonfinite_values: int
    params_finite: bool
    rule_info: dict
    workers: list[int]  # the worker ids aggregated, ascending
    missing: list[int]  # the worker ids whose pushes the round closed without


@dataclass(frozen=True)
class Aggregated:
    """A round's aggregate, computed and not yet applied (``ShardState.aggregate``)."""

    aggregate: np.ndarray
    mask: np.ndarray  # the workers aggregated
    elapsed_ms: float
    nonfinite: int  # non-finite values among the rows
    info: dict  # what the defence said of the round (``Defence.last_info``)
    workers: list[int]  # the worker ids aggregated, ascending (``mask``'s)
    missing: list[int]  # the others


def aggregate_rows(defence: Defence, grads: np.ndarray, received: np.ndarray, rows: int,
                   context: RoundContext,
                   blocks: list[tuple[int, int]]) -> list[Aggregated]:
    """Aggregate the ``rows`` received rows of ``grads`` (all, or those ``received`` at a
    deadline) with ``defence``, without applying it; one ``Aggregated`` per column block
    of ``blocks``: its slice of the aggregate, its non-finite inputs, its share (by
    width) of the time. Several blocks are a process's shards aggregated in one call,
    which only a ``coordinatewise`` defence may take. ``RuleError`` if the rule cannot
    take the rows."""
    mask = received.copy()
    defence.for_rows(rows)  # built (or RuleError) before the clock starts
    started = time.perf_counter()
    taken = grads if rows == grads.shape[0] else grads[mask]
    aggregate = defence(torch.from_numpy(taken), context).numpy()
    elapsed_ms = (time.perf_counter() - started) * 1e3
    nonfinite = nonfinite_counts(taken, blocks)
    width = grads.shape[1]
    workers, missing = np.flatnonzero(mask).tolist(), np.flatnonzero(~mask).tolist()
    return [Aggregated(aggregate[a:b], mask, elapsed_ms * (b - a) / width, count,
                       defence.last_info, workers, missing)
            for (a, b), count in zip(blocks, nonfinite, strict=True)]


class ShardState:
    """Parameters of shard ``shard`` and the gradients received for the current round."""

    def __init__(self, cfg: RunConfig, shard: int, initial: np.ndarray,
                 grads: np.ndarray | None = None) -> None:
        """``grads``: where the (n, size) rows of a round are received (a process's
        shards aggregated in one call share one matrix, ``server/group.py``); by default
        a matrix of the shard's own."""
        self.cfg = cfg
        self.shard = shard
        self.defence = Defence(cfg)
        self.size = int(np.size(initial))
        # each round's new parameters: a vector no reader holds any more (the history's
        # last rounds are kept, and a round's values are sent without a copy)
        self.vectors = HostBuffers(self.size)
        self.params = self.vectors.take()
        self.params[:] = initial
        self.round = 0
        self.grads = (np.empty((cfg.num_workers, self.size), dtype=np.float32)
                      if grads is None else grads)
        self.received = np.zeros(cfg.num_workers, dtype=bool)
        self.pushes = 0  # rows of the current round received so far (count of received)
        self.history: dict[int, np.ndarray] = {0: self.params}
        # round -> the workers it aggregated, for the rounds whose result is in history
        self.participation: dict[int, np.ndarray] = {}

    def restore(self, round_: int, params: np.ndarray,
                previous: np.ndarray | None = None,
                rule_state: dict[str, np.ndarray] | None = None) -> None:
        """Continue at ``round_`` with ``params`` (and the round before's, if saved) and
        the rule's state at that round (a stateful rule past round 0 needs it)."""
        if not 0 <= round_ <= self.cfg.rounds:
            raise ConfigError(f"checkpoint round {round_} outside 0..{self.cfg.rounds}")
        if params.size != self.size:
            raise ConfigError(f"checkpoint holds {params.size} values, shard {self.shard} "
                              f"has {self.size}")
        rule_state = dict(rule_state or {})
        if self.defence.stateful and round_ > 0 and not rule_state:
            raise ConfigError(f"checkpoint of round {round_} holds no state for rule "
                              f"{self.cfg.rule}, which carries it from round to round")
        for key, value in rule_state.items():
            if value.size != self.size:
                raise ConfigError(f"checkpoint's rule state {key!r} holds {value.size} "
                                  f"values, shard {self.shard} has {self.size}")
        try:  # names the rule does not carry: refused now, not at every round's step
            self.defence.set_state(rule_state)
        except RuleError as exc:
            raise ConfigError(f"checkpoint's rule state: {exc}") from exc
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.round = round_
        self.received[:] = False
        self.pushes = 0
        self.history = {round_: self.params}
        if previous is not None and round_ > 0 and previous.size == self.size:
            self.history[round_ - 1] = np.array(previous, dtype=np.float32, copy=True)
        # who pushed the round before is not saved; a push of it is answered as a
        # repeat (the pusher goes on at round_, as a late one would after stale-round)
        self.participation = ({round_ - 1: np.ones(self.cfg.num_workers, dtype=bool)}
                              if round_ else {})

    @property
    def finished(self) -> bool:
        return self.round >= self.cfg.rounds

    @property
    def complete(self) -> bool:
        """All n gradient shards of the current round have arrived."""
        return self.pushes == self.cfg.num_workers

    @property
    def rule_state(self) -> dict[str, np.ndarray]:
        """What a stateful rule carries to the next round (centered clipping: "center")."""
        return self.defence.state

    def params_at(self, round_: int) -> np.ndarray | None:
        """Parameters at ``round_``; None if that round is still to come.

        Raises ``Refused`` (STALE_ROUND / WRONG_ROUND) for rounds no longer
        kept or too far ahead.
        """
        if round_ in self.history:
            return self.history[round_]
        if round_ < self.round:
            raise Refused(
                ErrorCode.STALE_ROUND,
                f"round {round_} is no longer kept (current round {self.round})",
            )
        if round_ > self.cfg.rounds:
            raise Refused(
                ErrorCode.WRONG_ROUND, f"round {round_} is past the last round {self.cfg.rounds}"
            )
        return None

    def counted(self, round_: int, worker: int) -> bool:
        """Worker ``worker``'s push of ``round_`` is already in (this round, or a past
        round whose result is still kept: a past round had all n pushes)."""
        if not 0 <= worker < self.cfg.num_workers:
            return False
        if round_ == self.round:
            return bool(self.received[worker])
        aggregated = self.participation.get(round_)
        return aggregated is not None and bool(aggregated[worker])

    def step(self) -> RoundMetrics:
        """Aggregate the round's rows (all n, or those in at its deadline) and apply
        x <- x - lr_t * Aggr; advance the round. ``RuleError`` if the rule cannot take them."""
        return self.commit(self.aggregate())

    def aggregate(self) -> Aggregated:
        """The round's aggregate, computed but not applied (``commit`` applies it): the
        rule's state moves on, the parameters and the round do not. ``RuleError`` if the
        rule cannot take the rows."""
        context = RoundContext(self.cfg.seed, self.round, self.shard)
        return aggregate_rows(self.defence, self.grads, self.received, self.pushes, context,
                              [(0, self.size)])[0]

    def commit(self, done: Aggregated) -> RoundMetrics:
        """Apply x <- x - lr_t * Aggr of ``aggregate`` (lr_t: ``--lr`` on its step
        schedule, ``RunConfig.lr_at``) and advance the round."""
        started = time.perf_counter()
        new = self.vectors.take()  # x - lr_t * Aggr, as the float32 operations of numpy
        with np.errstate(over="ignore", invalid="ignore"):  # a model an attack broke: the
            # metrics' params_finite reports it (inf - inf is no warning for every round)
            np.multiply(np.float32(self.cfg.lr_at(self.round)), done.aggregate, out=new)
            np.subtract(self.params, new, out=new)
        self.params = new
        mask = done.mask
        metrics = RoundMetrics(
            round=self.round,
            aggregation_ms=done.elapsed_ms + (time.perf_counter() - started) * 1e3,
            nonfinite_values=done.nonfinite,
            params_finite=nonfinite_counts(new, [(0, new.size)])[0] == 0,
            rule_info=done.info,
            workers=done.workers,
            missing=done.missing,
        )
        self.participation[self.round] = mask
        self.participation.pop(self.round - HISTORY_ROUNDS, None)
        self.round += 1
        self.received[:] = False
        self.pushes = 0
        self.history[self.round] = self.params
        self.history.pop(self.round - HISTORY_ROUNDS, None)
        return metrics
