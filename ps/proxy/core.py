"""The behaviour of a proxy, without sockets: what each message becomes on the way.

``ProxyCore.from_worker(incoming)`` and ``from_server(incoming)`` take one received
message and return what to send on, to the server or back to a worker. The core owns:

* the corruption of PUSH payloads (and, with ``corrupt_params``, PARAMS replies) by a
  ``ShardCorruptor``;
* the pushes held until their whole round is in, when the attack reads the honest
  vectors (omniscient and the other vector attacks but gaussian);
* which worker each reply goes to (a PULL or ``pull_next`` push names it), so PARAMS
  are corrupted per worker deterministically;
* the per-round tallies written as metrics, and when the proxy may exit (the n ACKs
  of the last round went back).

Anything the proxy cannot decode or that the server will refuse (a worker id outside
0..n-1, a negative round, a payload whose length is not the shard's) is relayed
unchanged and uncorrupted: judging it is the server's job, and its ERROR goes back.
The ZeroMQ loop around it is ``ps/proxy/node.py``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from common.config import AttackConfig, RunConfig
from common.metrics import JsonlWriter
from common.protocol import Ack, Message, Params, Pull, Push, Welcome, encode, join_envelope
from ps.proxy.corruption import ShardCorruptor

if TYPE_CHECKING:
    from common.transport import Incoming, Peer


@dataclass(frozen=True)
class Outgoing:
    """Frames to send: to the server (``to_server``) or back through the front socket."""

    to_server: bool
    frames: list[Any]


@dataclass
class _RoundTally:
    pushes: int = 0
    corrupted: int = 0


@dataclass
class _HeldPush:
    envelope: list[Any]
    header: Push
    values: np.ndarray


@dataclass
class _Tables:
    tallies: dict[int, _RoundTally] = field(default_factory=lambda: defaultdict(_RoundTally))
    held: dict[int, dict[int, _HeldPush]] = field(default_factory=lambda: defaultdict(dict))
    puller: dict[Peer, int] = field(default_factory=dict)


class ProxyCore:
    """In-flight corruption for the shard that ``welcome`` describes."""

    def __init__(self, cfg: RunConfig, attack: AttackConfig, welcome: Welcome,
                 metrics: JsonlWriter | None = None) -> None:
        self.cfg = cfg
        self.attack = attack
        self.corruptor = ShardCorruptor(cfg, attack, welcome.shard, welcome.start, welcome.stop)
        self.shard_size = welcome.stop - welcome.start
        self.metrics = metrics or JsonlWriter(None)
        self.tables = _Tables()
        self.relayed_unparsed = 0
        self.final_acks = 0

    @property
    def finished(self) -> bool:
        """The n ACKs of the last round went back to the workers."""
        return self.final_acks >= self.cfg.num_workers

    # -- worker -> server --------------------------------------------------------

    def from_worker(self, incoming: Incoming) -> list[Outgoing]:
        msg = incoming.message
        if msg is None:
            self.relayed_unparsed += 1
            return [Outgoing(True, incoming.frames)]
        header = msg.header
        if isinstance(header, Pull):
            self.tables.puller[incoming.peer] = self._worker_or_none(header.worker)
        if isinstance(header, Push) and self._acceptable(header):
            return self._on_push(incoming.envelope, incoming.peer, msg)
        return [Outgoing(True, incoming.frames)]

    def _worker_or_none(self, worker: int) -> int:
        """``worker`` if it names a worker of the run, else -1 (nothing is corrupted)."""
        return worker if 0 <= worker < self.cfg.num_workers else -1

    def _acceptable(self, push: Push) -> bool:
        """A push the server may accept: only such pushes are corrupted or held."""
        return (0 <= push.worker < self.cfg.num_workers and push.round >= 0
                and push.length == self.shard_size)

    def _on_push(self, envelope: list[Any], peer: Peer, msg: Message) -> list[Outgoing]:
        push: Push = msg.header  # type: ignore[assignment]
        if push.pull_next:  # the reply will be PARAMS for this worker
            self.tables.puller[peer] = push.worker
        if self.corruptor.whole_round:
            held = self.tables.held[push.round]
            held[push.worker] = _HeldPush(envelope, push, np.array(msg.tensor()))
            if len(held) == self.cfg.num_workers:
                return self._release_round(push.round)
            return []
        values, changed = self.corruptor.corrupt_push(push.round, push.worker, msg.tensor())
        self._tally(push.round, changed)
        return [Outgoing(True, join_envelope(envelope, encode(push, values)))]

    def _release_round(self, round_: int) -> list[Outgoing]:
        held = self.tables.held.pop(round_)
        ordered = [held[i] for i in range(self.cfg.num_workers)]
        values, changed = self.corruptor.corrupt_round(round_, [h.values for h in ordered])
        self._tally(round_, changed, pushes=len(ordered))
        for old in [r for r in self.tables.held if r < round_]:
            self.tables.held.pop(old)  # pushes of a round that can no longer complete
        return [Outgoing(True, join_envelope(h.envelope, encode(h.header, v)))
                for h, v in zip(ordered, values, strict=True)]

    # -- server -> worker --------------------------------------------------------

    def from_server(self, incoming: Incoming) -> list[Outgoing]:
        if not incoming.envelope:
            return []  # a late reply to the proxy's own HELLO
        msg = incoming.message
        if msg is None:
            return [Outgoing(False, incoming.frames)]
        header = msg.header
        if isinstance(header, Ack) and header.round == self.cfg.rounds - 1:
            self.final_acks += 1
        if isinstance(header, Params) and self.attack.corrupt_params:
            worker = self.tables.puller.get(incoming.peer, -1)
            values, changed = self.corruptor.corrupt_params(header.round, worker, msg.tensor())
            if changed:
                self.metrics.write({"time": time.time(), "round": header.round,
                                    "worker": worker, "params_corrupted": changed})
            return [Outgoing(False, join_envelope(incoming.envelope, encode(header, values)))]
        return [Outgoing(False, incoming.frames)]

    # -- metrics -----------------------------------------------------------------

    def _tally(self, round_: int, changed: int, pushes: int = 1) -> None:
        """Count a round's relayed pushes; write its line once all n went through."""
        tally = self.tables.tallies[round_]
        tally.pushes += pushes
        tally.corrupted += changed
        if tally.pushes >= self.cfg.num_workers:
            self.metrics.write({"time": time.time(), "round": round_, "pushes": tally.pushes,
                                "corrupted_values": tally.corrupted,
                                "unparsed_relayed": self.relayed_unparsed})
            del self.tables.tallies[round_]
