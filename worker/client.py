"""Client side of the protocol: one DEALER per server (or per proxy standing in for one).

Requests to the S servers go out together and their replies are gathered with
one poller. Every request has a timeout; on timeout the socket is closed with
LINGER=0, reopened and the request resent (the ZeroMQ guide's Lazy Pirate
pattern), up to ``retries`` times, after which ``ClusterTimeout`` is raised.
A reopened socket is a new peer to the server, so it says HELLO again first (as it
does when a server answers ``hello-first``: its session was evicted, or a proxy in
between restarted). Resent pushes are idempotent: the server answers a push it already
counted as it did the first time (older servers: DUPLICATE, or STALE once the round
moved on; both count as accepted).

A server that restarted from a checkpoint behind the workers answers a push
``wrong-round`` with its own round r: the client replays, to that server only, the
pushes of rounds r.. it keeps (``replay_rounds`` of them), each waiting for its round
to complete, then resends the current one. Gradients are deterministic, so the run
stays bit-identical to the reference engine.

With keys each link is a CURVE client that checks the server's key; a failed handshake
(an impostor, a wrong address, a key the server does not admit) is seen on the socket's
monitor and ends the client with ``PeerError`` naming the endpoint, instead of a hang.
A key refused by the server ends it at once. A connection closed during the handshake
(what an impostor, unable to read the HELLO, does) ends it only if no handshake succeeds
for ``HANDSHAKE_GRACE_S`` (or when the request gives up): a TCP relay, load balancer or
docker-proxy in front of a server that is restarting or not yet reachable accepts the
connection and closes it the same way, and the link rides that out.

A connection that drops while a request waits for its reply (reset by a relay, a
middlebox or the peer) has lost whatever was in flight on it: the link is reopened and
the request resent at once, as after a timeout, instead of waiting out the timeout.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from common.config import RunConfig
from common.errors import ClusterTimeout, ConfigError, PeerError
from common.keys import CurveClient, KeyRing
from common.process import check_stop
from common.protocol import (
    Ack,
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
)
from common.transport import connect_dealer, receive, send_frames

log = logging.getLogger("ps.client")

# Replies are awaited in slices of at most this long, so a stop request is seen.
WAIT_SLICE_MS = 250
NOBLOCK = int(zmq.NOBLOCK)
# Times one request may be answered hello-first or wrong-round and resent.
MAX_RESENDS = 3
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
# The server refused this key, or the handshake broke its protocol: final at once.
HANDSHAKE_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
# Seconds a link may see its connections closed during the handshake (no detail: an
# impostor, or a relay whose server is not reachable yet) before it gives up.
HANDSHAKE_GRACE_S = 15.0


@dataclass(frozen=True)
class RetryPolicy:
    """Timeout per attempt (seconds) and how many times a request is resent."""

    timeout_s: float = 60.0
    retries: int = 3


class Link:
    """A DEALER socket to one endpoint that can be thrown away and reopened (and then
    says HELLO again before anything else)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, curve: CurveClient | None) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.curve = curve
        self.hello_frames: list | None = None  # set once the first HELLO went out
        self.welcomes_due = 0  # WELCOMEs to re-HELLOs still to come (skipped)
        # when a connection was first closed during the handshake, with none succeeding
        # since (kept across reopen: a resend does not restart the grace)
        self.failing_since: float | None = None
        self.connected = False  # a handshake succeeded on the current connection
        self.dropped = False  # a connection that had got through was lost since
        self.socket, self.monitor = self._open()

    def _open(self) -> tuple[zmq.Socket, zmq.Socket]:
        sock = connect_dealer(self.ctx, self.endpoint, linger_ms=0, curve=self.curve)
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
        if self.curve is not None:
            events |= HANDSHAKE_FAILED
        return sock, sock.get_monitor_socket(events)

    def reopen(self) -> None:
        self.close()
        self.socket, self.monitor = self._open()
        self.welcomes_due = 0
        self.connected = self.dropped = False
        self.hello_again()

    def hello_again(self) -> None:
        """Say HELLO before the next request (its WELCOME will be skipped)."""
        if self.hello_frames is not None:
            self.send(self.hello_frames)
            self.welcomes_due += 1

    def send(self, frames: list) -> None:
        """Send without blocking. A DEALER with no live connection (e.g. after a refused
        handshake) would block; then the handshake is checked and, if it did not fail,
        the request is left to the timeout and resend."""
        try:
            send_frames(self.socket, [b"", *frames], NOBLOCK)
        except zmq.Again:
            self.check_handshake()
            log.debug("%s: no connection to send on yet; the timeout will resend",
                      self.endpoint)

    def receive(self) -> Message | None:
        """The next reply (None if it was a re-HELLO's WELCOME); ``ProtocolError`` if it
        is malformed."""
        incoming = receive(self.socket)
        if incoming.message is None:
            raise incoming.error
        if incoming.envelope:
            raise ProtocolError("reply with a routing envelope before the delimiter")
        if self.welcomes_due and isinstance(incoming.message.header, Welcome):
            self.welcomes_due -= 1
            return None
        return incoming.message

    def check_handshake(self) -> None:
        """Read the socket's events: note a connection lost after its handshake
        (``dropped``); ``PeerError`` if the CURVE handshake with the endpoint was refused,
        or its connections kept being closed during it for ``HANDSHAKE_GRACE_S``."""
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.failing_since = None
                self.connected = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.dropped = self.dropped or self.connected
                self.connected = False
            elif event & HANDSHAKE_REFUSED:
                raise self.handshake_error()
            elif event & zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self.failing_since is None:
                self.failing_since = time.monotonic()
                log.warning("%s closed the connection during the security handshake; "
                            "retrying for up to %g s (a server restarting behind a relay?)",
                            self.endpoint, HANDSHAKE_GRACE_S)
        if (self.failing_since is not None
                and time.monotonic() - self.failing_since >= HANDSHAKE_GRACE_S):
            raise self.handshake_error()

    def handshake_error(self) -> PeerError:
        """The error that names this endpoint's failed handshake."""
        closed = ("" if self.failing_since is None else
                  f" (it closed every connection during the handshake for "
                  f"{time.monotonic() - self.failing_since:.0f} s)")
        return PeerError(
            f"the security handshake with {self.endpoint} failed{closed}: the peer there "
            f"does not hold the key of the server expected there, or does not admit "
            f"this process's key (an impostor, a wrong address, or the wrong --keys?)")

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)


class SentPushes:
    """The gradients this worker pushed in its last ``window`` rounds, to replay them."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._rounds: OrderedDict[int, np.ndarray] = OrderedDict()

    def record(self, round_: int, gradient: np.ndarray) -> None:
        if self.window <= 0:
            return
        self._rounds[round_] = np.array(gradient, copy=True)
        while len(self._rounds) > self.window:
            self._rounds.popitem(last=False)

    def get(self, round_: int) -> np.ndarray | None:
        return self._rounds.get(round_)


class ServerRefused(PeerError):
    """A server answered ERROR: its code, message and current round."""

    def __init__(self, endpoint: str, error: Error) -> None:
        super().__init__(f"{endpoint} refused: [{error.code}] {error.message}")
        self.code = error.code
        self.round = error.round


# What to do with a reply: return the value to keep, or raise.
ReplyCheck = Callable[[Message], object]


class ClusterClient:
    """Talks to the S shard endpoints of one run on behalf of a worker or evaluator."""

    def __init__(
        self,
        endpoints: list[str],
        cfg: RunConfig,
        role: str,
        worker: int,
        policy: RetryPolicy | None = None,
        keys: KeyRing | None = None,
        replay_rounds: int = 0,
    ) -> None:
        if len(endpoints) != cfg.num_shards:
            raise ConfigError(
                f"{len(endpoints)} server endpoints given for S={cfg.num_shards} shards"
            )
        self.cfg = cfg
        self.role = role
        self.worker = worker
        self.policy = policy or RetryPolicy()
        self.ctx = zmq.Context.instance()
        name = f"worker-{worker}" if role == "worker" else role
        self.links = [Link(self.ctx, e, keys.client_curve(name, s) if keys else None)
                      for s, e in enumerate(endpoints)]
        self.sent = SentPushes(replay_rounds)
        self.ranges: list[tuple[int, int]] = []
        self.d = 0

    def close(self) -> None:
        for link in self.links:
            link.close()

    # -- operations --------------------------------------------------------------

    def hello(self) -> list[Welcome]:
        """Handshake with every shard; learn the shard ranges and d."""
        hello = Hello(
            role=self.role,
            worker=self.worker,
            config_hash=self.cfg.config_hash,
            config=self.cfg.to_dict(),
        )
        count = len(self.links)
        frames = encode(hello)
        for link in self.links:
            link.hello_frames = frames
        replies = self._gather(dict.fromkeys(range(count), frames),
                               dict.fromkeys(range(count), _expect_welcome))
        welcomes = [replies[s] for s in range(count)]
        for s, w in enumerate(welcomes):
            if w.shard != s or w.num_shards != self.cfg.num_shards:
                raise ConfigError(
                    f"endpoint {self.links[s].endpoint} serves shard {w.shard} of {w.num_shards}, "
                    f"expected shard {s} of {self.cfg.num_shards} (check the endpoint order)"
                )
        self.ranges = [(w.start, w.stop) for w in welcomes]
        self.d = welcomes[0].d
        return welcomes

    def pull(
        self,
        round_: int,
        before_resend: Callable[[int], None] | None = None,
        into: np.ndarray | None = None,
        shards: list[int] | None = None,
    ) -> np.ndarray:
        """The full parameter vector x^t, assembled from every shard's PARAMS(t).

        ``before_resend(s)`` runs before a PULL is resent to shard s after a timeout
        (the worker re-pushes what a restarted server may have lost). ``into`` and
        ``shards`` fill only some shards' slices of an existing vector.
        """
        x = np.empty(self.d, dtype=np.float32) if into is None else into
        targets = range(len(self.links)) if shards is None else shards
        pull = encode(Pull(round=round_, worker=self.worker))
        self._gather(
            {s: pull for s in targets},
            {s: self._params_into(x, s, round_) for s in targets},
            before_resend=before_resend,
        )
        return x

    def push(
        self,
        round_: int,
        gradient: np.ndarray,
        pull_next: bool = False,
        before_resend: Callable[[int], None] | None = None,
    ) -> np.ndarray | None:
        """Send each shard its slice of the gradient for ``round_``.

        Without ``pull_next`` wait for the ACKs and return None. With it, each server
        answers with PARAMS(round_ + 1) once that round exists, and the assembled
        x^{t+1} is returned (a shard whose resent push was already counted is pulled).
        """
        self.sent.record(round_, gradient)
        requests = {}
        for s, (start, stop) in enumerate(self.ranges):
            header = Push(round=round_, worker=self.worker, length=stop - start,
                          pull_next=pull_next)
            requests[s] = encode(header, gradient[start:stop])
        if not pull_next:
            self._gather(requests, dict.fromkeys(requests, _expect_ack), idempotent=True,
                         push_round=round_)
            return None
        x = np.empty(self.d, dtype=np.float32)
        checks = {s: self._params_into(x, s, round_ + 1) for s in requests}
        results = self._gather(requests, checks, idempotent=True, push_round=round_)
        unanswered = [s for s, stored in results.items() if not stored]
        if unanswered:
            self.pull(round_ + 1, before_resend, into=x, shards=unanswered)
        return x

    def repush(self, shard: int, round_: int, gradient: np.ndarray) -> None:
        """Send shard ``shard`` its slice of ``gradient`` for ``round_`` again, once.

        Any answer will do (ACK, or DUPLICATE/STALE if the server still had it); no
        answer within the timeout is left to the caller's retry loop.
        """
        start, stop = self.ranges[shard]
        header = Push(round=round_, worker=self.worker, length=stop - start)
        link = self.links[shard]
        link.send(encode(header, gradient[start:stop]))
        deadline = time.monotonic() + self.policy.timeout_s
        while link.socket.poll(max(0, int((deadline - time.monotonic()) * 1000)), zmq.POLLIN):
            reply = link.receive()
            if reply is not None:
                log.info("re-pushed round %d to %s: %s", round_, link.endpoint,
                         type(reply.header).__name__)
                return
        link.reopen()

    def replay(self, shard: int, first: int, last: int) -> None:
        """Push to ``shard`` again the gradients of rounds ``first`` to ``last - 1``, each
        once its round is open there (a server that restarted behind the workers)."""
        log.warning("%s is at round %d, this worker at %d: replaying %d rounds",
                    self.links[shard].endpoint, first, last, last - first)
        start, stop = self.ranges[shard]
        for k in range(first, last):
            gradient = self.sent.get(k)
            if gradient is None:
                raise PeerError(
                    f"{self.links[shard].endpoint} restarted at round {first}, but this worker "
                    f"keeps only its last {self.sent.window} rounds (--replay-rounds) and is at "
                    f"round {last}")
            header = Push(round=k, worker=self.worker, length=stop - start, pull_next=True)
            self._gather({shard: encode(header, gradient[start:stop])},
                         {shard: lambda msg: _expect(msg, Params)}, idempotent=True)

    # -- machinery ---------------------------------------------------------------

    def _params_into(self, x: np.ndarray, shard: int, round_: int) -> ReplyCheck:
        """A check that copies shard ``shard``'s PARAMS(round_) into ``x``; returns True."""

        def check(msg: Message) -> bool:
            h = _expect(msg, Params)
            start, stop = self.ranges[shard]
            if h.round != round_ or h.length != stop - start:
                raise PeerError(
                    f"shard {shard} sent round {h.round} with {h.length} values, expected "
                    f"round {round_} with {stop - start}"
                )
            msg.tensor_into(x[start:stop])
            return True

        return check

    def _gather(
        self,
        requests: dict[int, list],
        checks: dict[int, ReplyCheck],
        idempotent: bool = False,
        before_resend: Callable[[int], None] | None = None,
        push_round: int | None = None,
    ) -> dict[int, object]:
        """Send ``requests[s]`` (encoded frames) to shard s; collect one reply per shard.

        Returns what ``checks[s]`` made of each reply. ``idempotent``: a resent request
        refused as DUPLICATE/STALE counts as accepted, with result None. ``push_round``:
        the requests push that round (a server behind it gets the rounds it lacks first).
        """
        results: dict[int, object] = {}
        pending = set(requests)

        def resend(s: int) -> None:
            """A new socket to shard s (it says HELLO again), then the request again."""
            self.links[s].reopen()
            if before_resend is not None:
                before_resend(s)
            self.links[s].send(requests[s])

        for attempt in range(self.policy.retries + 1):
            for s in pending:
                if attempt:
                    log.warning(
                        "no reply from %s in %.1f s; reconnecting (retry %d/%d)",
                        self.links[s].endpoint, self.policy.timeout_s, attempt,
                        self.policy.retries,
                    )
                    resend(s)
                else:
                    # a connection lost before this request held none of it: forget it
                    self.links[s].check_handshake()
                    self.links[s].dropped = False
                    self.links[s].send(requests[s])
            try:
                self._collect(pending, results, checks, resent=idempotent and attempt > 0,
                              requests=requests, push_round=push_round,
                              resend=resend, idempotent=idempotent)
            except Exception:
                # replies still due would be read as answers to the next request
                for s in pending:
                    self.links[s].reopen()
                raise
            if not pending:
                return results
        for s in sorted(pending):  # not a silent server: one whose handshake never got through
            self.links[s].check_handshake()
            if self.links[s].failing_since is not None:
                raise self.links[s].handshake_error()
        names = ", ".join(self.links[s].endpoint for s in sorted(pending))
        raise ClusterTimeout(
            f"no reply from {names} after {self.policy.retries + 1} attempts of "
            f"{self.policy.timeout_s:g} s"
        )

    def _collect(
        self,
        pending: set[int],
        results: dict[int, object],
        checks: dict[int, ReplyCheck],
        resent: bool,
        requests: dict[int, list],
        push_round: int | None,
        resend: Callable[[int], None],
        idempotent: bool,
    ) -> None:
        resends = dict.fromkeys(pending, 0)
        sent_again: set[int] = set()  # resent on a new socket: their connection dropped
        poller = zmq.Poller()
        by_socket = {}
        for s in pending:
            poller.register(self.links[s].socket, zmq.POLLIN)
            by_socket[self.links[s].socket] = s
        deadline = time.monotonic() + self.policy.timeout_s
        while pending:
            check_stop()
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return
            ready = poller.poll(min(remaining_ms, WAIT_SLICE_MS))
            if not ready:
                for s in pending:
                    link = self.links[s]
                    link.check_handshake()
                    # what was in flight on it is lost: resend it now, once (a peer that
                    # drops every such request is left to the timeout, not a storm)
                    if link.dropped and s not in sent_again:
                        log.warning("the connection to %s was lost with a request in flight; "
                                    "reconnecting and resending", link.endpoint)
                        poller.unregister(link.socket)
                        del by_socket[link.socket]
                        resend(s)
                        poller.register(link.socket, zmq.POLLIN)
                        by_socket[link.socket] = s
                        sent_again.add(s)
            for sock, _ in ready:
                s = by_socket[sock]
                link = self.links[s]
                try:
                    msg = link.receive()
                except ProtocolError as exc:
                    raise PeerError(f"{link.endpoint} sent a malformed reply: {exc}") from exc
                if msg is None:
                    continue  # the WELCOME to a re-HELLO
                header = msg.header
                if isinstance(header, Error) and resends[s] < MAX_RESENDS:
                    behind = (push_round is not None and header.code == ErrorCode.WRONG_ROUND.value
                              and header.round < push_round)
                    if header.code == ErrorCode.HELLO_FIRST.value or behind:
                        resends[s] += 1
                        if behind:
                            self.replay(s, header.round, push_round)
                        else:
                            link.hello_again()
                        link.send(requests[s])
                        deadline = time.monotonic() + self.policy.timeout_s
                        continue
                if isinstance(header, Error):
                    if not _accepted_on_resend(header,
                                               resent or (idempotent and s in sent_again)):
                        if header.code == ErrorCode.CONFIG_MISMATCH.value:
                            raise ConfigError(f"{link.endpoint} refused: {header.message}")
                        raise ServerRefused(link.endpoint, header)
                    results[s] = None
                else:
                    results[s] = checks[s](msg)
                pending.discard(s)
                poller.unregister(sock)


def _accepted_on_resend(error: Error, resent: bool) -> bool:
    """A resent push refused as DUPLICATE/STALE was counted by the server the first time."""
    return resent and error.code in (ErrorCode.DUPLICATE.value, ErrorCode.STALE_ROUND.value)


def _expect(msg: Message, kind: type) -> Header:
    header = msg.header
    if not isinstance(header, kind):
        raise PeerError(f"expected {kind.__name__}, got {type(header).__name__}")
    return header


def _expect_welcome(msg: Message) -> Welcome:
    return _expect(msg, Welcome)  # type: ignore[return-value]


def _expect_ack(msg: Message) -> Ack:
    return _expect(msg, Ack)  # type: ignore[return-value]
