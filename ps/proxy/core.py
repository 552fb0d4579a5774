"""The behaviour of a proxy, without sockets: what each message becomes on the way.

``ProxyCore.from_worker(incoming)`` and ``from_server(incoming)`` take one received
message and return what to send on, to the server or back to a worker. The core owns:

* the corruption of PUSH payloads (and, with ``corrupt_params``, PARAMS replies) by a
  ``ServerCorruptor``: the server process's shards it targets, each by its own
  ``ShardCorruptor``, the others untouched; with ``corrupt_params`` a push asking for
  bare PARAMS goes on asking for the values, which are each worker's own to corrupt;
* the pushes held until their whole round is in, when the attack reads the honest
  vectors (omniscient and the other vector attacks but gaussian);
* which worker each reply goes to (a PULL or ``pull_next`` push names it), so PARAMS
  are corrupted per worker deterministically;
* the per-round tallies written as metrics, and when the proxy may exit (the last
  round's ACKs went back to n distinct workers, or the server left in its last round).

The proxy checks what a worker sends exactly as the server would (``common.net.pushes``)
before it corrupts or holds anything, and answers what the server would refuse
itself: an undecodable message, a key pushing as another worker (``check_claim``), a
worker id outside 0..n-1, a round outside the run, a payload whose length is not the
shard's. It holds pushes only of the rounds the server can take next (its current round and the one
after, as the replies going back tell, an ERROR's round even when it goes back);
older rounds go to the server uncorrupted (it answers them, as repeats or stale).
Every table is bounded: held pushes by those two rounds, the reply routes by
``MAX_ROUTES`` (oldest out). Whatever a message makes the core raise is answered
``internal`` and counted, never fatal. Like the server, it keeps per-key budgets
(refusals beyond a rate dropped without reply, log lines throttled, peer text cut short)
and bars a key that sent a message larger than any legal one (here or over-long in
flight, which the node's in-flight guard reports): its messages are dropped and
``on_bar`` (the node's listener) refuses its handshakes. The ZeroMQ loop around it is
``ps/proxy/node.py``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from common.net.budgets import PeerPolicy, principal_of
from common.net.keys import Identity
from common.net.protocol import (
    Ack,
    Error,
    ErrorCode,
    Header,
    Message,
    Params,
    Pull,
    Push,
    Refused,
    Welcome,
    encode,
    join_envelope,
    reheaded,
)
from common.net.pushes import PushWindow, check_push
from common.net.refusals import Answering, header_as
from common.net.sharding import ServerSlices, format_shard_set
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import JsonlWriter
from ps.proxy.corruption import ServerCorruptor

if TYPE_CHECKING:
    from common.net.transport import Incoming, Peer

log = logging.getLogger("ps.proxy")

# Reply routes remembered (which worker a PARAMS reply goes to); the oldest go first.
MAX_ROUTES = 4096
UNREAD_REPLIES = "unread-replies"  # large replies dropped: the worker left earlier ones
# In the last round, how long the server's connection may stay down before the proxy
# leaves: the server finished the run and exited (a round deadline closed the last round
# without some workers, whose ACKs never come), or it is not coming back; a server
# killed and restarted reconnects sooner.
SERVER_GONE_S = 10.0


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
    puller: OrderedDict[Peer, int] = field(default_factory=OrderedDict)


class ProxyCore:
    """In-flight corruption in front of the server process that ``welcome`` describes,
    on its shards in ``targets`` (None: all of them)."""

    def __init__(self, cfg: RunConfig, attack: AttackConfig, welcome: Welcome,
                 metrics: JsonlWriter | None = None,
                 on_bar: Callable[[Identity, str], object] | None = None,
                 targets: tuple[int, ...] | None = None) -> None:
        self.cfg = cfg
        self.attack = attack
        slices = ServerSlices.of(welcome.d, cfg.num_shards, welcome.shards)
        self.targets = slices.shards if targets is None else tuple(
            s for s in slices.shards if s in targets)
        self.corruptor = ServerCorruptor(cfg, attack, slices, self.targets)
        self.length = slices.length
        self.name = format_shard_set(slices.shards)
        self.metrics = metrics or JsonlWriter(None)
        self.tables = _Tables()
        self.counters: Counter[str] = Counter()
        self.round = welcome.round  # the server's current round, as far as replies tell
        # the workers whose push of the last round was ACKed: each once, however often
        # it pushed again (the server ACKs each repeat)
        self.final_acked: set[int] = set()
        self.server_gone: float | None = None  # since when its connection is down (node's)
        self.first = slices.shards[0]  # the server process's name (its first shard)
        self.peers = PeerPolicy(self.counters, log, on_bar)
        self.answers: Answering[Outgoing] = Answering(
            self.peers, lambda envelope, error: Outgoing(False, join_envelope(
                envelope, encode(error))), lambda: self.round, self.peers.bar, self.first)
        # what a message of each type becomes (any other: relayed as it is)
        self._from_worker: dict[type[Header], Callable[[Incoming, Message], list[Outgoing]]] = {
            Pull: self._on_pull, Push: self._on_push}
        self._from_server: dict[type[Header],
                                Callable[[Incoming, Message, float], list[Outgoing]]] = {
            Error: self._on_error, Ack: self._on_ack, Params: self._on_params}

    def done(self, now: float) -> bool:
        """The run is over for this proxy: the last round's ACKs went back to all n
        workers, or the server, in its last round, has been gone for ``SERVER_GONE_S``
        (it exits once it finished). Workers' messages alone never end it: the ACKs are
        counted once per worker, however often one pushes the last round again."""
        if len(self.final_acked) >= self.cfg.num_workers:
            return True
        return (self.round >= self.cfg.rounds - 1 and self.server_gone is not None
                and now - self.server_gone >= SERVER_GONE_S)

    def server_link(self, up: bool, now: float) -> None:
        """The node saw the connection to the server come up or go down."""
        if up:
            self.server_gone = None
        elif self.server_gone is None:
            self.server_gone = now

    # -- worker -> server --------------------------------------------------------

    def from_worker(self, incoming: Incoming, now: float | None = None) -> list[Outgoing]:
        """What a worker's message becomes: relayed (maybe corrupted, maybe held), or
        answered here with the ERROR the server would send."""
        now = time.monotonic() if now is None else now

        def dispatch(message: Message) -> list[Outgoing]:
            if len(incoming.envelope) != 1:
                # a worker's DEALER adds no routing frame of its own: made-up ones would
                # each be a peer (a reply route), and take the message deeper at the server
                raise Refused(ErrorCode.MALFORMED, f"routing envelope of "
                              f"{len(incoming.envelope)} frames; a worker's message has "
                              "none of its own before the empty delimiter")
            handler = self._from_worker.get(type(message.header))
            if handler is not None:
                return handler(incoming, message)
            return [Outgoing(True, incoming.frames)]

        return self.answers.answer(incoming, principal_of(incoming), now, dispatch)

    def unread_reply(self, connection: Hashable) -> None:
        """A large reply to a worker's ``connection`` was dropped: its earlier ones are
        still untaken (``common.net.transport.ReplyLedger``); counted, logged within budget."""
        self.counters[UNREAD_REPLIES] += 1
        held = self.peers.loggable("unread", connection, time.monotonic())
        if held is not None:
            log.warning("dropped a reply to a worker's connection that has not taken its "
                        "earlier ones%s", f" ({held} more since the last line)" if held else "")

    def offence(self, identity: Identity | None, reason: str, now: float) -> None:
        """The node's in-flight guard cut a connection of ``identity`` (``Answering``)."""
        self.answers.offence(identity, reason, now)

    def _on_pull(self, incoming: Incoming, msg: Message) -> list[Outgoing]:
        """Relayed; the PARAMS reply goes to the worker it names."""
        pull = header_as(msg, Pull)
        self._route(incoming.peer, self._worker_or_none(pull.worker))
        return [Outgoing(True, incoming.frames)]

    def _worker_or_none(self, worker: int) -> int:
        """``worker`` if it names a worker of the run, else -1 (nothing is corrupted)."""
        return worker if 0 <= worker < self.cfg.num_workers else -1

    def _check_push(self, push: Push) -> None:
        """Refuse, as the server would, a push it cannot accept (a push of the round after
        the last as FINISHED, the server's answer once it finished); and rounds the proxy
        would have to hold beyond the next one."""
        window = PushWindow(self.cfg.num_workers, self.cfg.rounds, self.length,
                            current=self.round, oldest=0, newest=self.round + 1,
                            dtype=self.cfg.wire_dtype)
        check_push(window, push.round, push.worker, push.length,
                   finished=push.round == self.cfg.rounds, dtype=push.dtype)

    def _route(self, peer: Peer, worker: int) -> None:
        """Remember that PARAMS for ``peer`` go to ``worker`` (bounded, oldest out)."""
        routes = self.tables.puller
        routes[peer] = worker
        routes.move_to_end(peer)
        while len(routes) > MAX_ROUTES:
            routes.popitem(last=False)

    def _on_push(self, incoming: Incoming, msg: Message) -> list[Outgoing]:
        """Checked; corrupted (or held until its round is in) if of a round the server
        can take next, else relayed as it is."""
        push = header_as(msg, Push)
        self._check_push(push)
        envelope, peer = incoming.envelope, incoming.peer
        if push.bare_params and self.attack.corrupt_params:
            # each worker's PARAMS are corrupted on their own: none may borrow another's
            push = replace(push, bare_params=False)
            if push.round < self.round:
                return [Outgoing(True, join_envelope(envelope,
                                                      reheaded([b"", *msg.chunks], push)))]
        if push.round < self.round:
            return [Outgoing(True, incoming.frames)]
        if push.pull_next:  # the reply will be PARAMS for this worker
            self._route(peer, push.worker)
        if self.corruptor.whole_round:
            held = self.tables.held[push.round]
            # a copy of its own, which the attack may change (a bfloat16 push's is one)
            held[push.worker] = _HeldPush(envelope, push,
                                          np.require(msg.tensor(), requirements=("W", "O")))
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
        self._follow(round_ + 1)
        return [Outgoing(True, join_envelope(h.envelope, encode(h.header, v)))
                for h, v in zip(ordered, values, strict=True)]

    # -- server -> worker --------------------------------------------------------

    def from_server(self, incoming: Incoming, now: float | None = None) -> list[Outgoing]:
        """What a server's reply becomes on its way back (PARAMS maybe corrupted)."""
        if not incoming.envelope:
            return []  # a late reply to the proxy's own HELLO
        msg = incoming.message
        if msg is None:
            return [Outgoing(False, incoming.frames)]
        handler = self._from_server.get(type(msg.header))
        if handler is not None:
            return handler(incoming, msg, time.monotonic() if now is None else now)
        return [Outgoing(False, incoming.frames)]

    def _on_error(self, incoming: Incoming, msg: Message, now: float) -> list[Outgoing]:
        """Relayed; its round is the server's current one (it may have restarted)."""
        self._follow(header_as(msg, Error).round, restarted=True)
        return [Outgoing(False, incoming.frames)]

    def _on_ack(self, incoming: Incoming, msg: Message, now: float) -> list[Outgoing]:
        """Relayed; the ACKs of the last round count towards ``done``."""
        ack = header_as(msg, Ack)
        self._follow(ack.round)
        if ack.round == self.cfg.rounds - 1:
            self.final_acked.add(ack.worker)
        return [Outgoing(False, incoming.frames)]

    def _on_params(self, incoming: Incoming, msg: Message, now: float) -> list[Outgoing]:
        """Relayed, corrupted for its worker with ``corrupt_params``."""
        header = header_as(msg, Params)
        self._follow(header.round)
        if not self.attack.corrupt_params or header.bare:
            return [Outgoing(False, incoming.frames)]
        worker = self.tables.puller.get(incoming.peer, -1)
        values, changed = self.corruptor.corrupt_params(header.round, worker, msg.tensor())
        if changed:
            self.metrics.write({"time": time.time(), "round": header.round,
                                "worker": worker, "params_corrupted": changed})
        return [Outgoing(False, join_envelope(incoming.envelope, encode(header, values)))]

    def _follow(self, round_: int, restarted: bool = False) -> None:
        """The server is at ``round_``: forget what no push can complete any more.

        Moving on, held pushes and tallies of older rounds (their pushes are relayed
        now, not held). Moving back (``restarted``: an ERROR's round, the server resumed
        from an older checkpoint), what was kept for later rounds, which belongs to the
        server's previous life; the workers resend what it lost.
        """
        if round_ > self.round:
            stale = [r for r in self.tables.held if r < round_]
            gone = [r for r in self.tables.tallies if r < round_]
        elif restarted and round_ < self.round:
            stale = [r for r in self.tables.held if r > round_]
            gone = [r for r in self.tables.tallies if r > round_]
        else:
            return  # (an ACK or PARAMS of an older round says nothing new)
        self.round = round_
        for r in stale:
            del self.tables.held[r]
        for r in gone:  # a round that closed without some workers: its line now
            tally = self.tables.tallies.pop(r)
            if round_ > r and tally.pushes:
                self._write_tally(r, tally)

    # -- metrics -----------------------------------------------------------------

    def _tally(self, round_: int, changed: int, pushes: int = 1) -> None:
        """Count a round's relayed pushes; write its line once all n went through (or
        once the server moved past it without some: ``_follow``)."""
        tally = self.tables.tallies[round_]
        tally.pushes += pushes
        tally.corrupted += changed
        if tally.pushes >= self.cfg.num_workers:
            self._write_tally(round_, self.tables.tallies.pop(round_))

    def _write_tally(self, round_: int, tally: _RoundTally) -> None:
        """A round's metrics line, with the proxy's counters (what it refused, barred,
        left unanswered: a STATUS through the proxy reaches the server's)."""
        self.metrics.write({"time": time.time(), "round": round_, "pushes": tally.pushes,
                            "corrupted_values": tally.corrupted,
                            "errors": sum(self.counters.values()),
                            "counters": dict(self.counters)})
