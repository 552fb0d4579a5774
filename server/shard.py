"""State of one model shard and its synchronous round step (no sockets).

Round t of shard s (paper, Section 2):  x_s^{t+1} = x_s^t - lr * Aggr({g_{i,s}^t : i in [n]}),
with the n gradient shards ordered by worker id and Aggr the configured rule,
applied locally and coordinate-wise. The server's core (``server/core.py``) and
the in-process reference engine (``ps/reference/engine.py``) both drive this class,
which is what makes their results bit-identical.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from common.config import RunConfig
from common.errors import ConfigError
from common.protocol import ErrorCode, Message, Refused
from common.rules import make_rule

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


class ShardState:
    """Parameters of shard ``shard`` and the gradients received for the current round."""

    def __init__(self, cfg: RunConfig, shard: int, initial: np.ndarray) -> None:
        self.cfg = cfg
        self.shard = shard
        self.rule = make_rule(cfg.rule, cfg.num_workers, cfg.q, **cfg.rule_options())
        self.params = np.array(initial, dtype=np.float32, copy=True)
        self.size = self.params.size
        self.round = 0
        self.grads = np.empty((cfg.num_workers, self.size), dtype=np.float32)
        self.received = np.zeros(cfg.num_workers, dtype=bool)
        self.history: dict[int, np.ndarray] = {0: self.params}

    def restore(self, round_: int, params: np.ndarray) -> None:
        """Continue at ``round_`` with ``params`` (from a checkpoint)."""
        if not 0 <= round_ <= self.cfg.rounds:
            raise ConfigError(f"checkpoint round {round_} outside 0..{self.cfg.rounds}")
        if params.size != self.size:
            raise ConfigError(f"checkpoint holds {params.size} values, shard {self.shard} "
                              f"has {self.size}")
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.round = round_
        self.received[:] = False
        self.history = {round_: self.params}

    @property
    def finished(self) -> bool:
        return self.round >= self.cfg.rounds

    @property
    def complete(self) -> bool:
        """All n gradient shards of the current round have arrived."""
        return bool(self.received.all())

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
        return 0 <= round_ < self.round and round_ + 1 in self.history

    def push(self, round_: int, worker: int, values: np.ndarray | Message) -> None:
        """Validate one push and store its values (an array, or a received PUSH message).

        Raises ``Refused`` (UNKNOWN_WORKER, FINISHED, STALE_ROUND, WRONG_ROUND, DUPLICATE,
        WRONG_LENGTH) without storing anything.
        """
        message = isinstance(values, Message)
        length = values.header.length if message else values.size
        if not 0 <= worker < self.cfg.num_workers:
            raise Refused(
                ErrorCode.UNKNOWN_WORKER,
                f"worker {worker} is not in 0..{self.cfg.num_workers - 1}",
            )
        if self.finished:
            raise Refused(ErrorCode.FINISHED, f"the run finished after {self.cfg.rounds} rounds")
        if round_ != self.round:
            code = ErrorCode.STALE_ROUND if round_ < self.round else ErrorCode.WRONG_ROUND
            raise Refused(code, f"push for round {round_}, current round is {self.round}")
        if self.received[worker]:
            raise Refused(
                ErrorCode.DUPLICATE, f"worker {worker} already pushed round {round_}"
            )
        if length != self.size:
            raise Refused(
                ErrorCode.WRONG_LENGTH,
                f"push has {length} values, shard {self.shard} has {self.size}",
            )
        if message:
            values.tensor_into(self.grads[worker])
        else:
            self.grads[worker] = values
        self.received[worker] = True

    def step(self) -> RoundMetrics:
        """Aggregate the complete round and apply x <- x - lr * Aggr; advance the round."""
        if not self.complete:
            missing = np.flatnonzero(~self.received).tolist()
            raise RuntimeError(f"round {self.round} is not complete: missing workers {missing}")
        started = time.perf_counter()
        aggregate = self.rule(torch.from_numpy(self.grads)).numpy()
        self.params = self.params - np.float32(self.cfg.lr) * aggregate
        elapsed_ms = (time.perf_counter() - started) * 1e3
        nonfinite = int(self.grads.size - np.count_nonzero(np.isfinite(self.grads)))
        metrics = RoundMetrics(
            round=self.round,
            aggregation_ms=elapsed_ms,
            nonfinite_values=nonfinite,
            params_finite=bool(np.isfinite(self.params).all()),
            rule_info=dict(self.rule.last_info),
        )
        self.round += 1
        self.received[:] = False
        self.history[self.round] = self.params
        self.history.pop(self.round - HISTORY_ROUNDS, None)
        return metrics
