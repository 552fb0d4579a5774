"""The behaviour of one server process, without sockets: what each message gets back.

``ServerCore.handle(incoming, now)`` takes one received message (decoded, or the
reason it could not be) and returns the replies to send, each to the envelope it
names; ``done(now)`` says when the node may exit. The core owns everything a node
decides:

* the hosted shards' states and their round step together (``ShardGroup``: one PUSH
  carries a worker's slices of every hosted shard), and the round deadline
  (``server/deadline.py``: by default adaptive, a fixed ``--round-timeout``, or none): a
  round closes that long after its (q + 1)-th push with the pushes that are in, if at least
  the quorum K (else it waits for the K-th and logs why once);
  a push that comes after its round closed is answered ``stale-round``;
* who is absent: a worker a round closed without (dead, barred, or a straggler) is
  absent, and later rounds close as soon as every present worker has pushed (with the
  quorum), so a worker that is gone costs one deadline, not one per round; a worker
  that pushes or says HELLO again is present again;
* the bars: a key that sent a message larger than any legal one (here, or over-long
  in flight: the node's in-flight guard) is barred for the rest of the run: its
  messages are dropped, the ``on_bar`` callback (the node's listener) refuses its
  handshakes and cuts its connections, and its worker is absent;
* per-peer budgets (``common/net/budgets.py``): refusals beyond a rate per key are dropped
  without reply (counted ``unanswered``); refusals, HELLOs and internal errors are
  logged at most once per key and interval, with the text a peer controls cut short;
* the HELLO check of the run settings, and the sessions it opens: who may push as which
  worker (``server/sessions.py``), checked against the CURVE key of each message;
* PULLs and ``pull_next`` pushes parked until their round exists: at most one per peer
  and round, ``MAX_PARKED_PER_PEER`` per peer, ``MAX_PARKED`` in all; a round's PARAMS
  to all of them share one header and tensor (``bare_params`` pushes: one bare header);
* repeated pushes (a worker restarted between its shard pushes, or a lost reply),
  answered as the first one was;
* the readers that have not yet read the final round (the node lingers for them);
* the error counters, by code, sent in STATUS replies and the metrics; whatever a
  message makes the core raise is answered ``internal``, counted and logged, never fatal;
* the checkpoint cadence (a failed write is logged, counted and retried next time).

``now`` is an argument, so everything time-driven is tested with a fake clock; the
ZeroMQ loop around it is ``server/node.py``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from common.errors import ConfigError
from common.net.budgets import PeerPolicy, principal_name, principal_of
from common.net.keys import Identity
from common.net.protocol import (
    Ack,
    ErrorCode,
    Header,
    Hello,
    Message,
    Params,
    Pull,
    Push,
    Refused,
    Status,
    StatusReply,
    Welcome,
)
from common.net.refusals import Answering, header_as
from common.net.sharding import format_shard_set
from common.run.config import RunConfig
from common.run.metrics import JsonlWriter
from server.checkpoint import Checkpoint
from server.group import ShardGroup
from server.options import ServerOptions
from server.sessions import RelayTags, Session, Sessions
from server.shard import RoundMetrics

if TYPE_CHECKING:
    from common.net.transport import Incoming, Peer

log = logging.getLogger("ps.server")

# PULLs parked for future rounds: per peer, and in all (a peer cannot grow memory).
MAX_PARKED_PER_PEER = 2
MAX_PARKED = 4096
ROLES = ("worker", "evaluator", "proxy", "monitor")
LOG_EVERY_ROUNDS = 50
CHECKPOINT_FAILED = "checkpoint-failed"
REPEATED_PUSH = "repeated-push"
REPEATED_PULL = "repeated-pull"  # a PULL of a (peer, round) already parked
UNREAD_REPLIES = "unread-replies"  # large replies dropped: the peer left earlier ones


class RestoreError(ConfigError):
    """A checkpoint the core cannot continue from; ``shard``: whose."""

    def __init__(self, shard: int, message: str) -> None:
        super().__init__(message)
        self.shard = shard


@dataclass(frozen=True)
class Reply:
    """A message to send behind ``envelope``."""

    envelope: list[Any]
    header: Header
    tensor: np.ndarray | list[np.ndarray] | None = None


# answers one message of a type (the message, its sender's principal, now)
Handler = Callable[["Incoming", Hashable, float], "list[Reply]"]


class ServerCore:
    """One server process (its shards, ``options.shards``): handles messages, steps
    rounds, decides when to exit."""

    def __init__(
        self,
        cfg: RunConfig,
        options: ServerOptions,
        initial: np.ndarray,
        metrics: dict[int, JsonlWriter] | None = None,
        save: Callable[[list[Checkpoint]], None] | None = None,
        on_bar: Callable[[Identity, str], object] | None = None,
        relay: RelayTags | None = None,
    ) -> None:
        self.cfg = cfg
        self.options = options
        self.state = ShardGroup(cfg, options.shards(cfg), initial)
        self.d = initial.size
        self.name = format_shard_set(self.state.shards)  # for log lines
        # one metrics file per hosted shard (server-<s>.jsonl)
        self.metrics = metrics or {s: JsonlWriter(None) for s in self.state.shards}
        self.save = save
        self.counters: Counter[str] = Counter()
        self.sessions = Sessions()
        self.relay = relay  # checks relayed workers' end-to-end tags (None: no keys)
        # (peer, round) -> the envelope to answer with PARAMS(round)
        self.parked: dict[tuple[Peer, int], list[Any]] = {}
        self.bare: set[tuple[Peer, int]] = set()  # those parked by a bare_params push
        self.parked_per_peer: Counter[Peer] = Counter()
        self.readers_waiting: set[Peer] = set()
        self.evaluator_arrived = False  # an evaluator has said HELLO (--await-evaluator)
        self.evaluator_logged = False  # the line saying round 0 waits for it is out
        self.bytes_in = 0
        self.finished_at: float | None = None
        self.quorum = options.rows_needed(cfg)
        self.round_deadline = options.deadline()  # None: every round waits for all n
        # the pushes a round has from honest workers at least (n - q), and when the current
        # round reached them: the adaptive deadline's measure (server/deadline.py)
        self.honest_rows = max(1, cfg.num_workers - (cfg.q or 0))  # q: set by validate()
        self.honest_at: float | None = None
        # the push that starts a round's clock (its deadline and the span): the (q + 1)-th,
        # which the q Byzantine workers cannot send alone, early, to set the deadline
        self.clock_rows = min(self.honest_rows, (cfg.q or 0) + 1)
        self.arrived: set[int] = set()  # workers that said HELLO, and when the last first did
        self.last_arrival = float("-inf")
        self.round_opened: float | None = None  # when the current round's clock started
        self.waiting_logged = -1  # the round whose wait past its deadline was logged
        self.absent = np.zeros(cfg.num_workers, dtype=bool)
        self.peers = PeerPolicy(self.counters, log, on_bar)
        self.answers: Answering[Reply] = Answering(
            self.peers, Reply, lambda: self.state.round, self.bar, self.state.first)
        # what answers each message type a server accepts (any other: UNEXPECTED)
        self._handlers: dict[type[Header], Handler] = {
            Hello: self._on_hello, Pull: self._on_pull, Push: self._on_push,
            Status: self._on_status,
        }

    # -- lifecycle ---------------------------------------------------------------

    def restore(self, ckpts: list[Checkpoint]) -> None:
        """Continue from ``ckpts``, one per hosted shard in order, all of one round;
        ``RestoreError`` (naming the shard) if one belongs to another run or shard, or
        the rounds differ (the node then exits: configuration error)."""
        if len(ckpts) != len(self.state.states) or len({c.round for c in ckpts}) > 1:
            raise RestoreError(self.state.first, f"the checkpoints of shards {self.name} "
                               f"are at rounds {[c.round for c in ckpts]}, not one round")
        for state, ckpt in zip(self.state.states, ckpts, strict=True):
            if ckpt.config_hash != self.cfg.config_hash or ckpt.shard != state.shard:
                raise RestoreError(state.shard, f"checkpoint of shard {ckpt.shard} with "
                                   f"configuration {ckpt.config_hash}, not shard "
                                   f"{state.shard} with {self.cfg.config_hash}")
        for state, ckpt in zip(self.state.states, ckpts, strict=True):
            try:
                state.restore(ckpt.round, ckpt.params, ckpt.previous, ckpt.rule_state)
            except ConfigError as exc:
                raise RestoreError(state.shard, str(exc)) from exc

    def done(self, now: float) -> bool:
        """The run is over and no reader still waits for the final round (or the linger
        time after the last round has passed); with ``await_evaluator``, an evaluator that
        has not said HELLO yet is waited for too."""
        if self.finished_at is None:
            return False
        lingering = now - self.finished_at < self.options.linger_s
        expected = self.options.await_evaluator and not self.evaluator_arrived
        return not (lingering and (self.readers_waiting or expected))

    def checkpoint(self) -> None:
        """Save the shards now (if a store was given); a failure is logged and counted."""
        if self.save is None:
            return
        try:
            self.save(self.snapshot())
        except OSError as exc:
            self.counters[CHECKPOINT_FAILED] += 1
            log.error("checkpoint of round %d failed (%s); retrying at the next one",
                      self.state.round, exc)

    def snapshot(self) -> list[Checkpoint]:
        """Each hosted shard's state now, as checkpoints (in shard order)."""
        return [Checkpoint(state.shard, state.round, self.cfg.config_hash, state.params,
                           state.history.get(state.round - 1), dict(state.rule_state))
                for state in self.state.states]

    def tick(self, now: float) -> list[Reply]:
        """Time-driven work: closes a round at its deadline; marks the run finished once
        its last round is done."""
        if self.state.finished and self.finished_at is None:
            self.finished_at = now
        return self._close_if_ready(now)

    def _close_if_ready(self, now: float) -> list[Reply]:
        """The one place a round closes: if it may now (:meth:`_closing`), aggregate it
        and answer the PULLs parked for the next. If the rule raises, the round stays
        open (counted, logged) and is tried again with the next push or tick."""
        closing = self._closing(now)
        if closing is None:
            return []
        try:
            return self._finish_round(now, closing)
        except Exception:  # the rule raised: the round stays open, tried again later
            self.counters[ErrorCode.INTERNAL.value] += 1
            held = self.peers.loggable("internal", "closing", now)
            if held is not None:  # within the log budget: retried every push and tick
                log.exception("closing round %d failed%s", self.state.round,
                              f" ({held} more failures since the last line)" if held else "")
            return []

    def deadline(self) -> float | None:
        """When the current round may close without all n pushes (None: it may not)."""
        if self.round_deadline is None or self.round_opened is None or self.state.finished:
            return None
        start = self.round_opened
        if self.round_deadline.learning:  # workers still starting keep the round open
            start = max(start, self.last_arrival)
        return start + self.round_deadline.seconds()

    def _closing(self, now: float) -> str | None:
        """Why the round may close now: ``all`` n pushes are in; every ``present`` worker
        is in, with the quorum; or it is past its ``deadline`` with the quorum. None: it
        may not yet."""
        state = self.state
        if self._awaits_evaluator(now):
            return None
        if state.complete:
            return "all"
        if (state.pushes >= self.quorum and self.absent.any()
                and bool(np.all(state.received | self.absent))):
            return "present"
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return None
        if state.pushes >= self.quorum:
            return "deadline"
        if self.waiting_logged != state.round:
            self.waiting_logged = state.round
            log.warning("round %d is past its deadline with %d pushes; waiting for the "
                        "quorum of %d", state.round, state.pushes, self.quorum)
        return None

    def _awaits_evaluator(self, now: float) -> bool:
        """Round 0 stays open until an awaited evaluator (``--await-evaluator``) has
        said HELLO, at most ``--linger`` seconds after its (q + 1)-th push: the evaluator reads
        the run's starting point, however late it starts on a loaded host (the servers
        keep only a few past rounds). A run resumed past round 0 and one without an
        evaluator never wait."""
        if (not self.options.await_evaluator or self.evaluator_arrived or self.state.round
                or self.round_opened is None or now - self.round_opened >= self.options.linger_s):
            return False
        if not self.evaluator_logged:
            self.evaluator_logged = True
            log.info("round 0 waits for the evaluator's HELLO (at most %.0f s)",
                     self.options.linger_s)
        return True

    # -- messages ----------------------------------------------------------------

    def handle(self, incoming: Incoming, now: float) -> list[Reply]:
        """The replies to one received message (never raises for what a peer sent: the
        refusal path is ``common.net.refusals``, shared with the proxy)."""
        self.bytes_in += incoming.size
        principal = self._principal(incoming)

        def dispatch(message: Message) -> list[Reply]:
            handler = self._handlers.get(type(message.header))
            if handler is None:
                raise Refused(ErrorCode.UNEXPECTED,
                              f"a server does not accept {message.header.op.name}")
            return handler(incoming, principal, now)

        return self.answers.answer(incoming, principal, now, dispatch)

    def _principal(self, incoming: Incoming) -> Hashable:
        """Whom ``incoming``'s budgets are charged to (``common.net.budgets.principal_of``): a
        proxy's key, but, for a worker whose HELLO through it carried the worker's own
        tag (its session), (the proxy, that worker): one worker behind a proxy cannot
        spend the others' answers, and envelopes the key holder makes up share one."""
        principal = principal_of(incoming)
        identity = incoming.identity
        if identity is not None and identity.role == "proxy" and len(incoming.envelope) > 1:
            session = self.sessions.get(incoming.peer)
            if session is not None and session.relayed and session.role == "worker":
                return (identity.name, session.worker)
        return principal

    def reply_principal(self, envelope: Sequence[Any]) -> Hashable | None:
        """Whom a reply behind ``envelope`` is charged to (``common.net.transport.ReplyLedger``):
        the key of its peer's session ((proxy, worker) for a worker relayed through a
        proxy; the connection, and the worker it relays, without keys); None for a peer
        without a session (it gets only refusals, which are small)."""
        session = self.sessions.get(tuple(bytes(f) for f in envelope))
        if session is None:
            return None
        relayed = session.worker if len(envelope) > 1 else -1
        if session.identity is None:
            return (bytes(envelope[0]), relayed)
        if session.relayed and session.role == "worker":
            return (session.identity.name, session.worker)
        return session.identity.name

    def unread_reply(self, principal: Hashable) -> None:
        """A large reply to ``principal`` was dropped: its earlier ones are still untaken
        (``common.net.transport.ReplyLedger``); counted, logged within its budget."""
        self.counters[UNREAD_REPLIES] += 1
        held = self.peers.loggable("unread", principal, time.monotonic())
        if held is not None:
            log.warning("dropped a reply to %s, who has not taken its earlier ones%s",
                        principal_name(principal),
                        f" ({held} more since the last line)" if held else "")

    def offence(self, identity: Identity | None, reason: str, now: float) -> None:
        """The node's in-flight guard cut a connection of ``identity`` (``Answering``)."""
        self.answers.offence(identity, reason, now)

    def bar(self, identity: Identity, reason: str) -> None:
        """Bar ``identity`` for the rest of the run (see the module docstring)."""
        if (self.peers.bar(identity, reason) and identity.role == "worker"
                and 0 <= identity.index < self.cfg.num_workers):
            self.absent[identity.index] = True

    def _relay_tags(self) -> RelayTags:
        """The checker of relayed tags; FORBIDDEN without one (no worker's key here)."""
        if self.relay is None:
            raise Refused(ErrorCode.FORBIDDEN, "this server cannot check relayed workers' "
                          "end-to-end tags")
        return self.relay

    def _on_hello(self, incoming: Incoming, principal: Hashable, now: float) -> list[Reply]:
        hello = header_as(incoming.message, Hello)
        envelope, peer = incoming.envelope, incoming.peer
        if hello.role not in ROLES:
            raise Refused(ErrorCode.MALFORMED, f"unknown role {hello.role!r}")
        if hello.config_hash != self.cfg.config_hash:
            diffs = self.cfg.differences(hello.config) if hello.config else []
            if diffs:
                detail = "; ".join(diffs)
            elif hello.config:
                detail = "the same settings under another hash: another version?"
            else:
                detail = "no settings sent to compare"
            raise Refused(
                ErrorCode.CONFIG_MISMATCH,
                f"configuration hash {hello.config_hash} != server's {self.cfg.config_hash} "
                f"(server vs peer: {detail})",
            )
        if hello.role != "worker" and hello.worker != -1:
            # the worker id is part of a session's principal: only workers choose one
            raise Refused(ErrorCode.MALFORMED, f"a {hello.role} says HELLO with worker -1, "
                          f"not {hello.worker}")
        if hello.role == "worker" and not 0 <= hello.worker < self.cfg.num_workers:
            raise Refused(
                ErrorCode.UNKNOWN_WORKER,
                f"worker {hello.worker} is not in 0..{self.cfg.num_workers - 1}",
            )
        session = Session(hello.role, hello.worker, incoming.identity)
        if session.relayed and hello.role == "worker":
            self._relay_tags().check_hello(hello)
            session = Session(hello.role, hello.worker, incoming.identity, hello.nonce)
        if hello.role == "evaluator":
            self.evaluator_arrived = True
            # an evaluator that reconnected waits on its new socket, not its old ones
            self.readers_waiting.difference_update(self.sessions.peers_of(session))
            self.readers_waiting.add(peer)
        for gone in self.sessions.open(peer, session):
            self._forget(gone)
        if hello.role == "worker":
            self.absent[hello.worker] = False
            if hello.worker not in self.arrived:
                self.arrived.add(hello.worker)
                self.last_arrival = max(self.last_arrival, now)
        held = self.peers.loggable("hello", principal, now)
        if held is not None:
            log.info("hello from %s %d%s", hello.role, hello.worker,
                     f" ({held} more since the last line)" if held else "")
        welcome = Welcome(shards=list(self.state.shards), num_shards=self.cfg.num_shards,
                          d=self.d, length=self.state.size, round=self.state.round,
                          rounds=self.cfg.rounds)
        return [Reply(envelope, welcome)]

    def _on_pull(self, incoming: Incoming, principal: Hashable, now: float) -> list[Reply]:
        pull = header_as(incoming.message, Pull)
        self.sessions.require(incoming.peer)
        if (incoming.peer, pull.round) in self.parked:  # replaces it: one reply
            self.counters[REPEATED_PULL] += 1
        return self._answer_pull(incoming.envelope, incoming.peer, pull)

    def _on_status(self, incoming: Incoming, principal: Hashable, now: float) -> list[Reply]:
        return [Reply(incoming.envelope, self.status())]

    def _answer_pull(self, envelope: list[Any], peer: Peer, pull: Pull) -> list[Reply]:
        """PARAMS of ``pull.round``, or nothing yet (parked until that round exists)."""
        params = self.state.params_at(pull.round)
        if params is None:
            self._park(envelope, peer, pull.round)
            return []
        return self._params([envelope], pull.round, params)

    def _on_push(self, incoming: Incoming, principal: Hashable, now: float) -> list[Reply]:
        envelope, peer, message = incoming.envelope, incoming.peer, incoming.message
        session = self.sessions.require(peer)
        push = header_as(message, Push)
        if message is None:  # (header_as: it holds a push)
            raise TypeError("a push handler without a message")
        if session.role != "worker" or session.worker != push.worker:
            raise Refused(ErrorCode.FORBIDDEN, f"this peer said HELLO as {session.role} "
                          f"{session.worker}, not as worker {push.worker}")
        if session.relayed:
            self._relay_tags().check_push(push, session.nonce)
        self.absent[push.worker] = False  # it is there: later rounds wait for it again
        if self.state.counted(push.round, push.worker):
            # an aggregation that raised before: try again
            return self._answer_repeat(envelope, peer, push) + self._close_if_ready(now)
        if push.pull_next and (peer, push.round + 1) not in self.parked:
            self._check_parking_space(peer)  # before storing: a refused push leaves nothing
        self.state.push(push.round, push.worker, message)
        if self.round_opened is None and self.state.pushes >= self.clock_rows:
            self.round_opened = now
        if self.honest_at is None and self.state.pushes >= self.honest_rows:
            self.honest_at = now
        replies = []
        if push.pull_next:  # answered by PARAMS(round + 1)
            self._park(envelope, peer, push.round + 1, bare=push.bare_params)
        else:
            replies.append(Reply(envelope, Ack(round=push.round, worker=push.worker)))
        return replies + self._close_if_ready(now)

    def _answer_repeat(self, envelope: list[Any], peer: Peer, push: Push) -> list[Reply]:
        """Answer a push already counted as the first one was (its values are ignored)."""
        self.counters[REPEATED_PUSH] += 1
        if not push.pull_next:
            return [Reply(envelope, Ack(round=push.round, worker=push.worker))]
        return self._answer_pull(envelope, peer, Pull(round=push.round + 1, worker=push.worker))

    def _check_parking_space(self, peer: Peer) -> None:
        if self.parked_per_peer[peer] >= MAX_PARKED_PER_PEER:
            raise Refused(ErrorCode.BUSY, f"this peer already waits for "
                          f"{MAX_PARKED_PER_PEER} rounds")
        if len(self.parked) >= MAX_PARKED:
            raise Refused(ErrorCode.BUSY, f"too many parked PULLs ({MAX_PARKED})")

    def _park(self, envelope: list[Any], peer: Peer, round_: int, bare: bool = False) -> None:
        """Answer ``peer`` with PARAMS(round_) once it exists (again: once; the last
        request says whether bare)."""
        key = (peer, round_)
        if key not in self.parked:
            self._check_parking_space(peer)
            self.parked_per_peer[peer] += 1
        self.parked[key] = envelope
        if bare:
            self.bare.add(key)
        else:
            self.bare.discard(key)

    def _forget(self, peer: Peer) -> None:
        """Drop what an evicted session left: its parked PULLs, its reader mark."""
        for key in [k for k in self.parked if k[0] == peer]:
            del self.parked[key]
            self.bare.discard(key)
        self.parked_per_peer.pop(peer, None)
        self.readers_waiting.discard(peer)

    def _finish_round(self, now: float, closing: str) -> list[Reply]:
        """Aggregate the round (``closing`` says why it may close) and answer the PULLs
        parked for the next one.

        If the rule raises, the round stays open and is aggregated again with the next
        message or tick; what follows a successful step (metrics, checkpoint) cannot
        strand the parked PULLs: it is logged and counted if it fails.
        """
        stepped = self.state.step()
        m = stepped[-1][1]  # the participation is every hosted shard's
        if (self.round_deadline is not None and self.round_opened is not None
                and self.honest_at is not None):
            self.round_deadline.observe(self.honest_at - self.round_opened)
        self.round_opened = self.honest_at = None
        if m.missing:
            newly = [w for w in m.missing if not self.absent[w]]
            self.absent[m.missing] = True
            held = self.peers.loggable("absent", "deadline", now) if newly else None
            if held is not None:  # (a worker that says HELLO each round goes missing again)
                log.info("round %d closed at its deadline without workers %s: absent from "
                         "now on (later rounds close once every present worker is in)%s",
                         m.round, newly, f"; {held} such lines held back" if held else "")
        if self.state.finished:
            self.finished_at = now
        envelopes: list[list[Any]] = []
        bare: list[list[Any]] = []
        for key in [k for k in self.parked if k[1] == self.state.round]:
            (bare if key in self.bare else envelopes).append(self.parked.pop(key))
            self.bare.discard(key)
            self.parked_per_peer[key[0]] -= 1
            if not self.parked_per_peer[key[0]]:
                del self.parked_per_peer[key[0]]
        replies = self._params(envelopes, self.state.round,
                               [st.params for st in self.state.states])
        replies += self._params(bare, self.state.round, None)
        try:
            self._record(stepped, closing)
        except Exception:
            self.counters[ErrorCode.INTERNAL.value] += 1
            log.exception("recording round %d failed", self.state.round - 1)
        return replies

    def _record(self, stepped: list[tuple[int, RoundMetrics]], closing: str) -> None:
        """Each shard's metrics line of the round (``closed``: why it closed, see
        :meth:`_closing`; ``barred``: the keys barred so far), the checkpoint and the log
        line."""
        for shard, m in stepped:
            self._write_metrics(shard, m, closing)
        every = self.options.checkpoint_interval(self.d)
        if every and self.state.round % every == 0:
            self.checkpoint()
        m = stepped[-1][1]
        if m.round % LOG_EVERY_ROUNDS == 0 or self.state.finished:
            log.info("round %d aggregated in %.2f ms", m.round,
                     sum(x.aggregation_ms for _, x in stepped))

    def _write_metrics(self, shard: int, m: RoundMetrics, closing: str) -> None:
        self.metrics[shard].write({
            "time": time.time(),
            "shard": shard,
            "round": m.round,
            "lr": self.cfg.lr_at(m.round),  # the step size this round applied
            "aggregation_ms": round(m.aggregation_ms, 3),
            "nonfinite_values": m.nonfinite_values,
            "params_finite": m.params_finite,
            "bytes_in": self.bytes_in,
            "errors": sum(self.counters.values()),
            "rule_info": m.rule_info,
            "workers": m.workers,
            "missing": m.missing,
            "closed": closing,
            "barred": sorted(self.peers.barred),
        })

    # -- replies -----------------------------------------------------------------

    def _params(self, envelopes: list[list[Any]], round_: int,
                params: list[np.ndarray] | None) -> list[Reply]:
        """PARAMS(round_) behind each of ``envelopes``: the hosted shards' parameters, sent
        one after the other (None: bare). The replies share one header and one list of
        arrays, so the node encodes and copies them once for all (``Listener.send_all``)."""
        if not envelopes:
            return []
        if round_ >= self.cfg.rounds:
            self.readers_waiting.difference_update(tuple(bytes(f) for f in e)
                                                   for e in envelopes)
        header = Params(round=round_, shards=list(self.state.shards), length=self.state.size,
                        bare=params is None)
        return [Reply(envelope, header, params) for envelope in envelopes]

    def status(self) -> StatusReply:
        return StatusReply(
            shards=list(self.state.shards),
            round=self.state.round,
            rounds=self.cfg.rounds,
            finished=self.state.finished,
            pushes=np.flatnonzero(self.state.received).tolist(),
            counters=dict(self.counters),
        )


