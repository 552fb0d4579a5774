"""The shards one server process hosts, stepped together (no sockets).

A worker's PUSH to a process carries its gradient's slices of every shard the process
hosts, concatenated in shard order (``common.net.sharding.ServerSlices``), so the hosted
shards receive the same workers' rows in the same rounds and move in lockstep: one
round, one deadline, one participation for the process. Each shard keeps everything
else of its own, exactly as a shard alone in its process: its ``ShardState`` (the
parameters, the rule and its state, seeded by its own index), its metrics line and its
checkpoint file. A process hosting one shard is a group of one.

With a coordinate-wise defence (MarMed, MeaMed, trimmed mean; no pre-aggregation step:
``Defence.coordinatewise``), the hosted shards receive their rows into one (n, length)
matrix, a push is one copy, and a round is one rule call over all of them, whose
column blocks are, bit for bit, what each shard's own call would give: a process of
five shards aggregates as fast as one of a shard five times as wide. Any other defence
(Krum, a seeded pre-aggregator, a stateful rule) aggregates each shard on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from common.learn.rules.defence import Defence
from common.learn.rules.pre import RoundContext
from common.net.protocol import Message, Push, values_dtype
from common.net.pushes import PushWindow, check_push
from common.net.sharding import ServerSlices
from common.run.config import RunConfig
from server.shard import RoundMetrics, ShardState, aggregate_rows


class ShardGroup:
    """The ``ShardState`` of each hosted shard, and where each lies in a message."""

    def __init__(self, cfg: RunConfig, shards: Sequence[int], initial: np.ndarray) -> None:
        self.cfg = cfg
        self.slices = ServerSlices.of(initial.size, cfg.num_shards, shards)
        self.shards = self.slices.shards
        self.first = self.shards[0]  # the process's name: server-<first>, proxy-<first>
        self.d = initial.size
        self.size = self.slices.length
        # where each hosted shard lies in a message's values (and in ``grads``' columns)
        self.blocks = [(at, at + b - a) for at, (a, b) in zip(self.slices.offsets,
                                                              self.slices.ranges, strict=True)]
        # one matrix for all the hosted shards' rows, aggregated in one call (None: each
        # shard its own matrix and call)
        self.grads = (np.empty((cfg.num_workers, self.size), dtype=np.float32)
                      if len(self.shards) > 1 and Defence(cfg).coordinatewise else None)
        self.states = [ShardState(cfg, s, initial[a:b],
                                  None if self.grads is None else self.grads[:, lo:hi])
                       for s, (a, b), (lo, hi) in zip(self.shards, self.slices.ranges,
                                                       self.blocks, strict=True)]

    # The round-level view: every hosted shard is at the same round with the same rows
    # (a round steps all of them or none, ``step``).
    @property
    def round(self) -> int:
        return self.states[0].round

    @property
    def finished(self) -> bool:
        return self.states[0].finished

    @property
    def complete(self) -> bool:
        return self.states[0].complete

    @property
    def pushes(self) -> int:
        return self.states[0].pushes

    @property
    def received(self) -> np.ndarray:
        return self.states[0].received

    def counted(self, round_: int, worker: int) -> bool:
        """Worker ``worker``'s push of ``round_`` is already in (see ``ShardState``)."""
        return self.states[0].counted(round_, worker)

    def params_at(self, round_: int) -> list[np.ndarray] | None:
        """Each hosted shard's parameters at ``round_`` (None: still to come; ``Refused``
        as ``ShardState.params_at``)."""
        found = [state.params_at(round_) for state in self.states]
        if found[0] is None:
            return None
        return cast("list[np.ndarray]", found)  # (the shards move in step: all have it)

    def push(self, round_: int, worker: int, values: np.ndarray | Message) -> None:
        """Validate one push of the whole group's slices (``Refused`` as
        ``common.net.pushes.check_push``, storing nothing) and store each shard's part."""
        dtype: str | None = None  # the message's (None: the run's)
        if isinstance(values, Message):
            header = values.header
            if not isinstance(header, Push):
                raise TypeError(f"a push of a {type(header).__name__} message")
            length, dtype = header.length, values_dtype(header)
        else:
            length = values.size
        first = self.states[0]
        window = PushWindow(self.cfg.num_workers, self.cfg.rounds, self.size,
                            current=first.round, oldest=first.round, newest=first.round,
                            dtype=self.cfg.wire_dtype)
        check_push(window, round_, worker, length, first.finished, first.received,
                   dtype=window.dtype if dtype is None else dtype)
        rows = ([self.grads[worker]] if self.grads is not None
                else [state.grads[worker] for state in self.states])
        if isinstance(values, Message):
            values.tensor_into(*rows)
        else:
            at = 0
            for row in rows:
                row[:] = values[at:at + row.size]
                at += row.size
        for state in self.states:
            state.received[worker] = True
            state.pushes += 1

    def step(self) -> list[tuple[int, RoundMetrics]]:
        """Aggregate the round on every hosted shard, or on none: if one shard's rule
        raises (``RuleError`` for rows it cannot take, or a bug), the rule states of the
        shards aggregated before it are put back and the round stays open on all of them;
        (shard, metrics) of each."""
        if self.grads is not None:  # one call for all (a coordinate-wise defence: no state)
            first = self.states[0]
            done = aggregate_rows(first.defence, self.grads, first.received, first.pushes,
                                  RoundContext(self.cfg.seed, first.round, first.shard),
                                  self.blocks)
            return [(state.shard, state.commit(part))
                    for state, part in zip(self.states, done, strict=True)]
        saved = [{k: np.array(v, copy=True) for k, v in state.defence.state.items()}
                 for state in self.states]
        done = []
        try:
            for state in self.states:
                done.append(state.aggregate())
        except BaseException:
            for state, before in zip(self.states, saved, strict=True):
                state.defence.state = before
            raise
        return [(state.shard, state.commit(result))
                for state, result in zip(self.states, done, strict=True)]
