"""The behaviour of a worker's (or evaluator's) side of the protocol, without sockets.

A ``ClientCore`` runs one *exchange* at a time: a request to each server process (a
*link*: one endpoint, hosting a set of the S shards, ``common.net.sharding``) and one
answer from each; a push carries the slices of every shard the process hosts, a
PARAMS reply their parameters. ``hello(now)``, ``pull(round_, now)``, ``push(round_,
gradient, now)`` (whose PARAMS may be asked bare: see ``NextRound.owed``, ``borrow``
and ``pull_owed``) and ``catch_up(round_, now)`` start one and return what to send;
``handle(link, reply, now)`` and ``tick(now)`` return what to send next;
``connection(link, events, now)`` reports what a link's socket monitor saw. Once
``pending`` is empty, ``outcome`` holds the exchange's result. The core owns every
decision of the exchange:

* a timeout per request (``RetryPolicy``): on timeout the request is resent on a new
  connection, which says HELLO again first (the ZeroMQ guide's Lazy Pirate pattern), up
  to ``retries`` times, then ``ClusterTimeout``;
* a connection that drops while a request waits for its reply (reset by a relay, a
  middlebox or the peer) has lost whatever was in flight: resent at once on a new
  connection, once per attempt (a peer that drops every request is left to the timeout);
* ``hello-first`` (the server evicted the session, or a proxy in between restarted):
  HELLO again, then the request, up to ``MAX_RESENDS`` times per attempt; the WELCOMEs
  to these HELLOs are skipped;
* resent pushes are idempotent: a resent push refused ``duplicate`` or ``stale-round``
  was counted the first time (a ``pull_next`` push counted so is followed by a PULL of
  the next round, and that PULL, when resent, by the push again, once: a server that
  restarted may have lost it);
* ``wrong-round`` with an older round (a server resumed from a checkpoint behind the
  worker): the pushes of the rounds it lacks are replayed from ``SentPushes`` (the
  last ``replay_rounds``), each once its round is open there, then the push is resent.
  Gradients are deterministic, so the run stays bit-identical to the reference engine;
* ``stale-round`` on a worker's push (its round closed without it, at a round deadline):
  the worker *catches up*, pulling the first round every shard still serves; past the
  last round, the run is over for it (``NextRound``);
* the security handshake: a key the server refuses ends the client at once
  (``PeerError``); a connection closed during the handshake (an impostor, unable to read
  the HELLO, does this, but so does a TCP relay whose server is restarting) ends it
  only if no handshake succeeds for ``HANDSHAKE_GRACE_S``, or when the request gives up;
* a reply it cannot use (malformed, larger than any legal one, of the wrong kind, or
  any other ERROR: a Byzantine server, or a proxy in between, may send one whenever it
  likes) is counted (``bad_replies``, by kind) and costs one attempt: the request is
  resent on a new connection, up to ``retries`` times; then the last one ends the
  exchange: ``ServerRefused`` (``ConfigError`` for ``config-mismatch``), ``PeerError``.

``now`` is an argument, so every branch is tested with a fake clock
(``tests/unit/worker/test_worker_core.py``); the ZeroMQ sockets and the poll loop
around it are ``worker/client.py``.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from common.errors import ClusterTimeout, ConfigError, PeerError
from common.net.budgets import excerpt
from common.net.protocol import (
    Ack,
    Buffer,
    Error,
    ErrorCode,
    Header,
    Hello,
    Message,
    Params,
    ProtocolError,
    Pull,
    Push,
    Welcome,
    encode,
    reheaded,
)
from common.net.relay_auth import hello_tag, new_nonce, push_tag
from common.net.sharding import ServerSlices, ShardSet, format_shard_set, parse_servers
from common.run.buffers import HostBuffers
from common.run.config import RunConfig

log = logging.getLogger("ps.client")

# Times one request may be answered hello-first or wrong-round and resent (per attempt).
MAX_RESENDS = 3
# Seconds a link may see its connections closed during the handshake (no detail: an
# impostor, or a relay whose server is not reachable yet) before it gives up.
HANDSHAKE_GRACE_S = 15.0


@dataclass(frozen=True)
class RetryPolicy:
    """Timeout per attempt (seconds) and how many times a request is resent."""

    timeout_s: float = 60.0
    retries: int = 3


class Connection(enum.Enum):
    """What a link's socket monitor saw (``ClientCore.connection``)."""

    SUCCEEDED = "handshake succeeded"
    DISCONNECTED = "disconnected"
    REFUSED = "handshake refused"  # the server refused this key, or broke the protocol
    CLOSED = "closed during the handshake"  # no detail: an impostor, or a relay


@dataclass(frozen=True)
class Send:
    """Frames to send on link ``link``; ``reopen``: on a new connection (the old
    socket is closed first, whatever was queued on it is dropped)."""

    link: int
    frames: list[Buffer]
    reopen: bool = False


@dataclass(frozen=True)
class NextRound:
    """Where a worker goes on after a push: round ``round`` from ``params`` (x^round;
    None once ``round`` is past the last one). ``missed``: the pushed round closed
    without this worker, which caught up. ``owed``: the links whose PARAMS came bare
    (``push(bare_params=True)``): their slices of ``params`` are still to be filled,
    from another worker's x^round (``borrow``) or pulled (``pull_owed``). Once nothing is
    owed, ``params`` is only read: the workers of a process compute from it without
    loading it again (``GradientComputer``), and it is written again only once the pool
    (``common.run.buffers``) hands it out anew, which it does when nothing holds it."""

    round: int
    params: np.ndarray | None
    missed: bool = False
    owed: tuple[int, ...] = ()


# What a reader returns for a bare PARAMS: this link's slices are owed.
_OWED = "owed"


class ServerRefused(PeerError):
    """A server answered ERROR: its code, message and current round."""

    def __init__(self, endpoint: str, error: Error) -> None:
        super().__init__(f"{endpoint} refused: [{error.code}] {error.message}")
        self.code = error.code
        self.round = error.round


class SentPushes:
    """The gradients this worker pushed in its last ``window`` rounds, to replay them."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._rounds: OrderedDict[int, np.ndarray] = OrderedDict()

    def record(self, round_: int, gradient: np.ndarray) -> None:
        """Keep ``gradient`` (not a copy: a pushed gradient is never modified, its frames
        are sent without a copy)."""
        if self.window <= 0:
            return
        self._rounds[round_] = gradient
        while len(self._rounds) > self.window:
            self._rounds.popitem(last=False)

    def get(self, round_: int) -> np.ndarray | None:
        return self._rounds.get(round_)


@dataclass
class _Step:
    """One request to one server process, what answers it, and its progress.

    ``expect``: the header of the answer (None: any answer ends it, a best-effort
    re-push); a ``Params`` answer of round ``params_round`` is copied into ``into``
    (with ``bare_ok``, a bare one is taken: its values are owed; without ``into``, a
    replayed push's, its header is the answer)."""

    frames: list[Buffer]
    expect: type[Header] | None
    into: np.ndarray | None = None
    params_round: int = 0
    bare_ok: bool = False
    idempotent: bool = False  # a push: refused as a repeat after a resend, it counts
    push_round: int | None = None  # a push of this round: a server behind it is replayed
    repush: list[Buffer] | None = None  # pushed once before a resend on a new connection
    on_repeat: _Step | None = None  # what follows when the server had counted it already
    attempt: int = 0
    resends: int = 0  # hello-first / wrong-round answers this attempt
    dropped_resent: bool = False  # resent this attempt: its connection dropped
    deadline: float = 0.0

    @property
    def best_effort(self) -> bool:
        """Any answer ends it; no answer within the timeout: a new connection, go on."""
        return self.expect is None

    def resent(self) -> bool:
        """Sent more than once on new connections (a repeat refusal means it counted)."""
        return self.idempotent and (self.attempt > 0 or self.dropped_resent)


@dataclass
class _Link:
    """What the core knows of one server process's connection (its ``shards``; where
    they lie in the model, once d is known), and its queue of requests."""

    endpoint: str
    shards: ShardSet = ()
    slices: ServerSlices | None = None
    steps: deque[_Step] = field(default_factory=deque)
    welcomes_due: int = 0  # WELCOMEs to re-HELLOs still to come (skipped)
    # when a connection was first closed during the handshake, with none succeeding
    # since (kept across reconnects: a resend does not restart the grace)
    failing_since: float | None = None
    connected: bool = False  # a handshake succeeded on the current connection
    dropped: bool = False  # a connection that had got through was lost since
    # the key this worker shares with the server process end to end (None: no proxy in
    # between, or no keys), and the nonce this process drew for its sessions there: its
    # HELLO and push headers carry their tags, so the proxy on the way carries only what
    # the worker sent (common/net/relay_auth.py)
    auth: bytes | None = None
    nonce: str = ""
    hello: list[Buffer] = field(default_factory=list)

    def handshake_error(self, now: float) -> PeerError:
        """The error that names this endpoint's failed handshake."""
        closed = ("" if self.failing_since is None else
                  f" (it closed every connection during the handshake for "
                  f"{now - self.failing_since:.0f} s)")
        return PeerError(
            f"the security handshake with {self.endpoint} failed{closed}: the peer there "
            f"does not hold the key of the server expected there, or does not admit "
            f"this process's key (an impostor, a wrong address, the wrong --keys, or a "
            f"ps-proxy in front of it that --via-proxy does not name?)")


class Exchange(enum.Enum):
    """What the exchange under way is: its kind decides its outcome and what a
    ``stale-round`` refusal does in it (``ClientCore._outcome``, ``_stale``)."""

    HELLO = "hello"  # the WELCOMEs; stale: refused
    PULL = "pull"  # x^round; stale: refused
    CATCH_UP = "catch-up"  # the first round >= round every server serves; stale: further
    PUSH = "push"  # the push of round - 1 and x^round back; stale: caught up
    FILL = "fill"  # the values a bare PARAMS of round left out; stale: caught up


@dataclass
class _Exchange:
    """The exchange under way: its kind, its round (for a push: the round after the one
    pushed), where PARAMS go, and for ``FILL`` the place it fills and whether it pushes
    again (else pulls)."""

    kind: Exchange
    round: int = 0
    params: np.ndarray | None = None
    missed: bool = False
    filling: NextRound | None = None
    by_push: bool = False


def server_list(cfg: RunConfig, servers: list[str] | list[tuple[ShardSet, str]],
                ) -> list[tuple[ShardSet, str]]:
    """The server processes as (shards, endpoint): given so, or plain endpoints (the
    contiguous blocks of ``common.net.sharding.server_blocks``, one shard each for S)."""
    names = [e for e in servers if isinstance(e, str)]
    if len(names) == len(servers):
        return parse_servers(",".join(names), cfg.num_shards)
    return [e for e in servers if not isinstance(e, str)]


class ClientCore:
    """The exchanges of one worker (``worker`` >= 0) or evaluator with the server
    processes ``servers``: (shards, endpoint) each, or plain endpoints (see
    :func:`server_list`)."""

    def __init__(self, cfg: RunConfig, role: str, worker: int,
                 servers: list[str] | list[tuple[ShardSet, str]],
                 policy: RetryPolicy | None = None, replay_rounds: int = 0,
                 vectors: HostBuffers | None = None,
                 auth: Callable[[int], bytes | None] | None = None) -> None:
        """``vectors``: where the parameters a server process sends are received (reused
        host vectors of d values, shared by the workers of a process), else new arrays.
        ``auth``: the key a worker shares with server process s (its first shard), to
        tag its HELLOs and push headers end to end where a proxy relays them (None, or
        None for s: untagged; a direct connection's CURVE key says who speaks)."""
        self.cfg = cfg
        self.vectors = vectors
        self.worker = worker
        self.policy = policy or RetryPolicy()
        self.links = [_Link(e, shards) for shards, e in server_list(cfg, servers)]
        self.sent = SentPushes(replay_rounds)
        self.d = 0
        for link in self.links:
            hello = Hello(role=role, worker=worker, config_hash=cfg.config_hash,
                          config=cfg.to_dict())
            key = auth(link.shards[0]) if auth is not None and role == "worker" else None
            if key is not None:
                link.auth, link.nonce = key, new_nonce()
                hello = replace(hello, nonce=link.nonce, tag=hello_tag(
                    key, cfg.config_hash, worker, link.shards[0], link.nonce))
            link.hello = encode(hello)
        self.pending: set[int] = set()
        self.bad_replies: Counter[str] = Counter()  # unusable replies survived, by kind
        self.results: dict[int, object] = {}
        self.outcome: object = None
        self.exchange = _Exchange(Exchange.HELLO)

    # -- exchanges ---------------------------------------------------------------

    def hello(self, now: float) -> list[Send]:
        """Say HELLO to every server; ``outcome``: the WELCOMEs (d, and so where each
        server's shards lie, is learnt from them)."""
        steps = {s: _Step(link.hello, Welcome) for s, link in enumerate(self.links)}
        return self._begin(steps, _Exchange(Exchange.HELLO), now)

    def pull(self, round_: int, now: float) -> list[Send]:
        """Pull x^round_ from every server; ``outcome``: the assembled vector."""
        x = self._vector()
        return self._begin(self._pulls(x, round_), _Exchange(Exchange.PULL, round_, x), now)

    def catch_up(self, round_: int, now: float, missed: bool = False) -> list[Send]:
        """``outcome``: ``NextRound`` of the first round >= ``round_`` that every server
        still serves (a worker that starts late, or whose push came after its round
        closed, goes on there)."""
        x = self._vector()
        return self._begin(self._pulls(x, round_),
                           _Exchange(Exchange.CATCH_UP, round_, x, missed), now)

    def borrow(self, at: NextRound, x: np.ndarray) -> NextRound:
        """``at`` complete: the slices it owes copied from ``x``, x^at.round as another
        worker of this process received it (the same values: one aggregate per round);
        ``x`` itself if every link is owed (parameters are never modified in place)."""
        if len(at.owed) == len(self.links) or at.params is None:
            return NextRound(at.round, x, at.missed)
        for server in at.owed:
            for a, b in self._slices(self.links[server]).spans:
                at.params[a:b] = x[a:b]
        return NextRound(at.round, at.params, at.missed)

    def pull_owed(self, at: NextRound, now: float) -> list[Send]:
        """Ask the servers ``at`` owes for their values itself (no other worker of the
        process holds x^at.round, or it waited too long for one): its push of the round
        before again, now asking for the values, from its replay window (a server that
        counted it answers PARAMS; one restarted behind it has the rounds in between
        replayed, as for any push), else a PULL. ``outcome``: ``at`` complete, or the
        first round every server still serves (caught up)."""
        kept = self.sent.get(at.round - 1)
        params = at.params
        if params is None:
            raise ValueError("a place past the last round owes nothing")
        steps = {s: self._pull_step(params, s, at.round) if kept is None
                 else self._push_step(s, at.round - 1, kept, params)
                 for s in at.owed}
        return self._begin(steps, _Exchange(Exchange.FILL, at.round, params, at.missed,
                                            filling=at, by_push=kept is not None), now)

    def _skip_ahead(self, server: int, error: Error, missed: bool, now: float) -> list[Send]:
        """A pull refused as stale (``error.round`` past it, checked): catch up where that
        server is."""
        return self._abandon_but(server) + self.catch_up(error.round, now, missed)

    def push(self, round_: int, gradient: np.ndarray, now: float,
             bare_params: bool = False) -> list[Send]:
        """Send each server process the slices of the gradient for ``round_`` of every
        shard it hosts, in one message (``gradient``: float32, or bfloat16 bits with
        ``--wire-dtype bfloat16``); ``outcome``: the worker's ``NextRound``. Before
        the last round each server answers with PARAMS of the next round once it exists
        (``pull_next``), bare with ``bare_params`` (a process of several workers takes
        x^{round_+1} from one of them: see ``NextRound.owed``); the last round is ACKed.
        ``gradient`` must not change afterwards: it is sent, and kept to replay, as it is."""
        self.sent.record(round_, gradient)
        x = self._vector() if round_ + 1 < self.cfg.rounds else None
        steps = {s: self._push_step(s, round_, gradient, x, bare_params)
                 for s in range(len(self.links))}
        return self._begin(steps, _Exchange(Exchange.PUSH, round_ + 1, x), now)

    def _push_step(self, server: int, round_: int, gradient: np.ndarray,
                   x: np.ndarray | None, bare_params: bool = False) -> _Step:
        """The push of ``round_`` to ``server``: ACKed, or with ``x`` (not the last round)
        answered by PARAMS(round_ + 1) copied into ``x`` (bare with ``bare_params``)."""
        link = self.links[server]
        values = self._slices_of(link, gradient)
        header = replace(self._push_header(link, round_), pull_next=x is not None,
                         bare_params=x is not None and bare_params)
        step = _Step(encode(header, values), Ack, idempotent=True, push_round=round_)
        if x is not None:
            step.expect, step.into = Params, x
            step.params_round, step.bare_ok = round_ + 1, bare_params
            # counted already: its reply was lost; PULL the next round instead
            step.on_repeat = self._pull_step(x, server, round_ + 1)
            step.on_repeat.repush = reheaded(  # the same values, not encoded again
                step.frames, self._push_header(link, round_))
        return step

    def _push_header(self, link: _Link, round_: int) -> Push:
        """This worker's push header of ``round_`` to ``link``'s server process, with its
        end-to-end tag when keys are in use (``pull_next`` and ``bare_params`` off)."""
        length = self._slices(link).length
        header = Push(round=round_, worker=self.worker, length=length,
                      dtype=self.cfg.wire_dtype)
        if link.auth is None:
            return header
        return replace(header, tag=push_tag(link.auth, self.cfg.config_hash, self.worker,
                                            link.shards[0], link.nonce, round_, length,
                                            self.cfg.wire_dtype))

    def _caught_up(self, server: int, error: Error, now: float) -> list[Send]:
        """A push refused as stale (its round closed without this worker; ``error.round``
        past it, checked): catch up."""
        abandoned = self._abandon_but(server)
        if error.round >= self.cfg.rounds:  # the last round closed without it
            self.pending.clear()
            self.outcome = NextRound(error.round, None, missed=True)
            return abandoned
        return abandoned + self.catch_up(error.round, now, missed=True)

    def abandon(self) -> list[Send]:
        """Give up the exchange (it raised): each server still waiting gets a new
        connection, so the replies still due are not read as answers to the next one."""
        sends = self._abandon_but(-1)
        self.pending.clear()
        return sends

    def _vector(self) -> np.ndarray:
        """A host vector of d values to receive parameters into (one of ``vectors`` if
        they are of this length: a model of another d is refused after the HELLO)."""
        if self.vectors is not None and self.vectors.length == self.d:
            return self.vectors.take()
        return np.empty(self.d, dtype=np.float32)

    # -- inputs ------------------------------------------------------------------

    def handle(self, server: int, reply: Message | ProtocolError, now: float) -> list[Send]:
        """What to send after server ``server``'s reply (a ``ProtocolError``: malformed).
        Raises what ends the exchange: ``ServerRefused``, ``PeerError``, ``ConfigError``."""
        link = self.links[server]
        if isinstance(reply, ProtocolError):
            if server not in self.pending:
                self.bad_replies["malformed"] += 1  # nothing waits for it: dropped
                return []
            error = PeerError(f"{link.endpoint} sent a malformed reply: {reply}")
            return self._bad_reply(server, "malformed", error, now)
        if server not in self.pending:
            return []
        handler = _HANDLERS.get(type(reply.header), ClientCore._on_answer)
        return handler(self, server, reply, now)

    def connection(self, server: int, events: list[Connection], now: float) -> None:
        """What server ``server``'s socket monitor saw. ``PeerError`` if the server refused
        the handshake, or closed connections during it for ``HANDSHAKE_GRACE_S``."""
        link = self.links[server]
        for event in events:
            if event is Connection.SUCCEEDED:
                link.failing_since = None
                link.connected = True
            elif event is Connection.DISCONNECTED:
                link.dropped = link.dropped or link.connected
                link.connected = False
            elif event is Connection.REFUSED:
                raise link.handshake_error(now)
            elif link.failing_since is None:
                link.failing_since = now
                log.warning("%s closed the connection during the security handshake; "
                            "retrying for up to %g s (a server restarting behind a relay?)",
                            link.endpoint, HANDSHAKE_GRACE_S)
        self._check_grace(link, now)

    def tick(self, now: float) -> list[Send]:
        """Time-driven work: a request whose connection dropped is resent (once per
        attempt), one past its timeout resent or given up (``ClusterTimeout``)."""
        sends: list[Send] = []
        gave_up = []
        for s in sorted(self.pending):
            link = self.links[s]
            self._check_grace(link, now)
            step = link.steps[0]
            if link.dropped and not step.best_effort and not step.dropped_resent:
                log.warning("the connection to %s was lost with a request in flight; "
                            "reconnecting and resending", link.endpoint)
                step.dropped_resent = True
                sends += self._reconnect(s, now)
            elif now < step.deadline:
                continue
            elif step.best_effort:  # a re-push nobody answered: go on without it
                sends.append(self._new_connection(s))
                link.steps.popleft()
                sends += self._send(s, now)
            elif step.attempt < self.policy.retries:
                step.attempt += 1
                step.resends = 0
                step.dropped_resent = False
                log.warning("no reply from %s in %.1f s; reconnecting (retry %d/%d)",
                            link.endpoint, self.policy.timeout_s, step.attempt,
                            self.policy.retries)
                sends += self._reconnect(s, now)
            else:
                gave_up.append(s)
        for s in gave_up:  # not a silent server: one whose handshake never got through
            if self.links[s].failing_since is not None:
                raise self.links[s].handshake_error(now)
        if gave_up:
            names = ", ".join(self.links[s].endpoint for s in gave_up)
            raise ClusterTimeout(f"no reply from {names} after {self.policy.retries + 1} "
                                 f"attempts of {self.policy.timeout_s:g} s")
        return sends

    def next_deadline(self) -> float | None:
        """When ``tick`` has work next, at the latest (None: no exchange)."""
        return min((self.links[s].steps[0].deadline for s in self.pending), default=None)

    # -- replies (the dispatch table ``_HANDLERS``) -------------------------------

    def _on_welcome(self, server: int, reply: Message, now: float) -> list[Send]:
        link = self.links[server]
        if link.welcomes_due:  # the WELCOME to a re-HELLO
            link.welcomes_due -= 1
            return []
        return self._on_answer(server, reply, now)

    def _on_error(self, server: int, reply: Message, now: float) -> list[Send]:
        error = reply.header
        if not isinstance(error, Error):  # dispatched on its type (_HANDLERS)
            raise TypeError(f"an ERROR handler got {type(error).__name__}")
        link = self.links[server]
        step = link.steps[0]
        if step.best_effort:
            return self._on_answer(server, reply, now)
        code = error.code
        behind = (step.push_round is not None and code == ErrorCode.WRONG_ROUND.value
                  and 0 <= error.round < step.push_round)
        if (code == ErrorCode.HELLO_FIRST.value or behind) and step.resends < MAX_RESENDS:
            step.resends += 1
            if step.push_round is not None and behind:
                return self._replay(server, error.round, step.push_round, now)
            return [self._hello_again(server), *self._send(server, now)]
        if step.resent() and code in (ErrorCode.DUPLICATE.value, ErrorCode.STALE_ROUND.value):
            return self._complete(server, None, now)  # counted the first time
        if code == ErrorCode.STALE_ROUND.value:
            answered = self._stale(server, error, now)
            if answered is not None:
                return answered
        if code == ErrorCode.CONFIG_MISMATCH.value:
            return self._bad_reply(server, code, ConfigError(
                f"{link.endpoint} refused: {error.message}"), now)
        return self._bad_reply(server, code, ServerRefused(link.endpoint, error), now)

    def _bad_reply(self, server: int, kind: str, error: Exception, now: float) -> list[Send]:
        """A reply the request cannot use: counted, and one attempt spent (resent on a
        new connection); ``error`` raised once the attempts are spent."""
        self.bad_replies[kind] += 1
        link = self.links[server]
        step = link.steps[0]
        if step.attempt >= self.policy.retries:
            raise error
        step.attempt += 1
        step.resends = 0
        step.dropped_resent = False
        log.warning("%s; reconnecting and resending (retry %d/%d)", excerpt(error),
                    step.attempt, self.policy.retries)
        return self._reconnect(server, now)

    def _on_answer(self, server: int, reply: Message, now: float) -> list[Send]:
        step = self.links[server].steps[0]
        if step.expect is None:
            log.info("re-pushed to %s: %s", self.links[server].endpoint,
                     type(reply.header).__name__)
            return self._complete(server, True, now)
        try:
            value = self._read(server, step, reply)
        except PeerError as exc:  # of the wrong kind, round or size
            return self._bad_reply(server, "unusable", exc, now)
        return self._complete(server, value, now)

    # -- machinery ---------------------------------------------------------------

    def _begin(self, steps: dict[int, _Step], exchange: _Exchange, now: float) -> list[Send]:
        """Start ``exchange``: ``steps[s]`` to server s (its outcome: ``_outcome``)."""
        self.pending = set(steps)
        self.results = {}
        self.outcome = None
        self.exchange = exchange
        sends = []
        for s, step in steps.items():
            link = self.links[s]
            link.dropped = False  # a connection lost before this request held none of it
            link.steps = deque([step])
            sends += self._send(s, now)
        return sends

    def _send(self, server: int, now: float) -> list[Send]:
        """Send server ``server``'s current request; its timeout starts now."""
        step = self.links[server].steps[0]
        step.deadline = now + self.policy.timeout_s
        return [Send(server, step.frames)]

    def _complete(self, server: int, value: object, now: float) -> list[Send]:
        """Server ``server``'s current request is answered with ``value`` (None: it had been
        counted already): send its next one, or record the server's result."""
        link = self.links[server]
        step = link.steps.popleft()
        if value is None and step.on_repeat is not None:
            link.steps.appendleft(step.on_repeat)
        if link.steps:
            return self._send(server, now)
        self.results[server] = value
        self.pending.discard(server)
        if not self.pending:
            self.outcome = self._outcome()
        return []

    def _outcome(self) -> object:
        """The outcome of the exchange just answered by every server, by its kind."""
        ex = self.exchange
        if ex.kind is Exchange.HELLO:
            return self._welcomed()
        if ex.kind is Exchange.PULL:
            return ex.params
        if ex.kind is Exchange.PUSH:
            owed = tuple(sorted(s for s, v in self.results.items() if v is _OWED))
            return NextRound(ex.round, ex.params, owed=owed)
        return NextRound(ex.round, ex.params, ex.missed)  # CATCH_UP, FILL

    def _stale(self, server: int, error: Error, now: float) -> list[Send] | None:
        """What a ``stale-round`` refusal does in the exchange, by its kind (None: it is
        refused like any other ERROR)."""
        ex = self.exchange
        pulled = ex.kind is Exchange.CATCH_UP or (ex.kind is Exchange.FILL and not ex.by_push)
        if not pulled and ex.kind not in (Exchange.PUSH, Exchange.FILL):
            return None
        asked = ex.round if pulled else ex.round - 1  # the round pulled, or pushed
        if not asked < error.round <= self.cfg.rounds:  # no honest server says so
            return self._bad_reply(server, ErrorCode.STALE_ROUND.value, PeerError(
                f"{self.links[server].endpoint} says round {asked} is stale at round "
                f"{error.round}, not one of {asked + 1}..{self.cfg.rounds}"), now)
        if pulled:
            missed = ex.missed if ex.kind is Exchange.CATCH_UP else True
            return self._skip_ahead(server, error, missed, now)
        return self._caught_up(server, error, now)  # its push came after its round

    def _new_connection(self, server: int) -> Send:
        """A new connection to the server (the old one closed) that says HELLO first."""
        link = self.links[server]
        link.connected = link.dropped = False
        link.welcomes_due = 1
        return Send(server, link.hello, reopen=True)

    def _hello_again(self, server: int) -> Send:
        """HELLO on the same connection before the next request (its WELCOME skipped)."""
        link = self.links[server]
        link.welcomes_due += 1
        return Send(server, link.hello)

    def _reconnect(self, server: int, now: float) -> list[Send]:
        """The current request again on a new connection (after a re-push, if it has one)."""
        link = self.links[server]
        sends = [self._new_connection(server)]
        repush = link.steps[0].repush
        if repush is not None:
            link.steps.appendleft(_Step(repush, expect=None))
        return sends + self._send(server, now)

    def _abandon_but(self, server: int) -> list[Send]:
        """New connections for the servers still waiting, but ``server``."""
        return [self._new_connection(s) for s in sorted(self.pending) if s != server]

    def _replay(self, server: int, first: int, last: int, now: float) -> list[Send]:
        """Push to ``server`` again the gradients of rounds ``first`` to ``last - 1`` (each
        once its round is open there), then the current request."""
        link = self.links[server]
        log.warning("%s is at round %d, this worker at %d: replaying %d rounds",
                    link.endpoint, first, last, last - first)
        replays = []
        for k in range(first, last):
            gradient = self.sent.get(k)
            if gradient is None:
                raise PeerError(
                    f"{link.endpoint} restarted at round {first}, but this worker keeps "
                    f"only its last {self.sent.window} rounds (--replay-rounds) and is at "
                    f"round {last}")
            header = replace(self._push_header(link, k), pull_next=True)
            replays.append(_Step(encode(header, self._slices_of(link, gradient)),
                                 Params, idempotent=True))
        link.steps.extendleft(reversed(replays))
        return self._send(server, now)

    def _check_grace(self, link: _Link, now: float) -> None:
        if link.failing_since is not None and now - link.failing_since >= HANDSHAKE_GRACE_S:
            raise link.handshake_error(now)

    def _welcomed(self) -> list[Welcome]:
        """The WELCOMEs, checked: each endpoint hosts the shards expected there, all of
        one model; d learnt, and where each server's shards lie."""
        welcomes = [w for s in range(len(self.links))
                    if isinstance(w := self.results[s], Welcome)]
        if len(welcomes) != len(self.links):
            raise PeerError("a HELLO was answered by something other than a WELCOME")
        for link, w in zip(self.links, welcomes, strict=True):
            if w.d < self.cfg.num_shards or not 0 <= w.round <= self.cfg.rounds:
                raise PeerError(f"{link.endpoint} says it holds d={w.d} values at round "
                                f"{w.round}: no server of {self.cfg.num_shards} shards "
                                f"and {self.cfg.rounds} rounds does")
        for link, w in zip(self.links, welcomes, strict=True):
            if tuple(w.shards) != link.shards or w.num_shards != self.cfg.num_shards:
                raise ConfigError(
                    f"endpoint {link.endpoint} serves shards "
                    f"{format_shard_set(w.shards) or 'none'} of {w.num_shards}, expected "
                    f"{format_shard_set(link.shards)} of {self.cfg.num_shards} (check the "
                    f"endpoint order, or name each server's shards: SHARDS@ENDPOINT)")
        if len({w.d for w in welcomes}) > 1:
            raise ConfigError(f"the servers hold models of different sizes: "
                              f"{sorted({w.d for w in welcomes})}")
        self.d = welcomes[0].d
        for link, w in zip(self.links, welcomes, strict=True):
            link.slices = ServerSlices.of(self.d, self.cfg.num_shards, link.shards)
            if w.length != link.slices.length:
                raise PeerError(f"{link.endpoint} says its shards hold {w.length} values, "
                                f"not {link.slices.length}")
        return welcomes

    @staticmethod
    def _slices(link: _Link) -> ServerSlices:
        """Where ``link``'s shards lie in the model (known once its WELCOME came)."""
        if link.slices is None:
            raise ValueError(f"{link.endpoint}: no WELCOME yet, d is not known")
        return link.slices

    @classmethod
    def _slices_of(cls, link: _Link, vector: np.ndarray) -> list[np.ndarray]:
        """``vector``'s values on ``link``'s shards: one view per contiguous span."""
        return [vector[a:b] for a, b in cls._slices(link).spans]

    def _pulls(self, x: np.ndarray, round_: int) -> dict[int, _Step]:
        return {s: self._pull_step(x, s, round_) for s in range(len(self.links))}

    def _pull_step(self, x: np.ndarray, server: int, round_: int) -> _Step:
        """PULL(round_) from ``server``, its PARAMS copied into ``x``."""
        frames = encode(Pull(round=round_, worker=self.worker))
        return _Step(frames, Params, into=x, params_round=round_)

    def _read(self, server: int, step: _Step, msg: Message) -> object:
        """The value of ``msg`` answering ``step`` (``PeerError`` if it cannot): its
        header; for PARAMS, ``True`` once copied into ``step.into`` (each span of the
        link's shards where it lies), or ``_OWED`` for a bare one the step takes."""
        expect = step.expect
        if expect is None or not isinstance(msg.header, expect):
            raise PeerError(f"expected {expect.__name__ if expect else 'any'}, got "
                            f"{type(msg.header).__name__}")
        h = msg.header
        if isinstance(h, Ack) and step.push_round is not None and (
                h.round, h.worker) != (step.push_round, self.worker):
            raise PeerError(f"{self.links[server].endpoint} acknowledged round {h.round} of "
                            f"worker {h.worker}, not round {step.push_round} of worker "
                            f"{self.worker}")
        if not isinstance(h, Params) or step.into is None:  # a replay: its header will do
            return h
        link = self.links[server]
        slices = self._slices(link)
        if (h.round != step.params_round or h.length != slices.length
                or tuple(h.shards) != link.shards):
            raise PeerError(
                f"{link.endpoint} sent round {h.round} of shards "
                f"{format_shard_set(h.shards) or 'none'} with {h.length} values, expected "
                f"round {step.params_round} of shards {format_shard_set(link.shards)} with "
                f"{slices.length}")
        if h.bare:
            if not step.bare_ok:
                raise PeerError(f"{link.endpoint} sent a bare PARAMS of round {h.round}, "
                                f"which this worker did not ask for")
            return _OWED
        msg.tensor_into(*self._slices_of(link, step.into))
        return True


_Handler = Callable[[ClientCore, int, Message, float], list[Send]]
_HANDLERS: dict[type, _Handler] = {
    Welcome: ClientCore._on_welcome,
    Error: ClientCore._on_error,
}
