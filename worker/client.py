"""Client side of the protocol: one DEALER per server (or per proxy standing in for one).

Requests to the S servers go out together and their replies are gathered with
one poller. Every request has a timeout; on timeout the socket is closed with
LINGER=0, reopened and the request resent (the ZeroMQ guide's Lazy Pirate
pattern), up to ``retries`` times, after which ``ClusterTimeout`` is raised.
Resent pushes are idempotent: the server answers DUPLICATE (or STALE once the
round moved on, which in synchronous SGD implies the push was counted), and
both count as accepted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from common.config import RunConfig
from common.errors import ClusterTimeout, ConfigError, PeerError
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
from common.transport import connect_dealer, receive

log = logging.getLogger("ps.client")

# Replies are awaited in slices of at most this long, so a stop request is seen.
WAIT_SLICE_MS = 250


@dataclass(frozen=True)
class RetryPolicy:
    """Timeout per attempt (seconds) and how many times a request is resent."""

    timeout_s: float = 60.0
    retries: int = 3


class Link:
    """A DEALER socket to one endpoint that can be thrown away and reopened."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.socket = self._open()

    def _open(self) -> zmq.Socket:
        return connect_dealer(self.ctx, self.endpoint, linger_ms=0)

    def reopen(self) -> None:
        self.socket.close(linger=0)
        self.socket = self._open()

    def send(self, frames: list) -> None:
        self.socket.send_multipart([b"", *frames], copy=False)

    def receive(self) -> Message:
        """The next reply; ``ProtocolError`` if it is malformed."""
        incoming = receive(self.socket)
        if incoming.message is None:
            raise incoming.error
        if incoming.envelope:
            raise ProtocolError("reply with a routing envelope before the delimiter")
        return incoming.message

    def close(self) -> None:
        self.socket.close(linger=0)


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
        self.links = [Link(self.ctx, e) for e in endpoints]
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
        replies = self._gather(dict.fromkeys(range(count), encode(hello)),
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
        requests = {}
        for s, (start, stop) in enumerate(self.ranges):
            header = Push(round=round_, worker=self.worker, length=stop - start,
                          pull_next=pull_next)
            requests[s] = encode(header, gradient[start:stop])
        if not pull_next:
            self._gather(requests, dict.fromkeys(requests, _expect_ack), idempotent=True)
            return None
        x = np.empty(self.d, dtype=np.float32)
        checks = {s: self._params_into(x, s, round_ + 1) for s in requests}
        results = self._gather(requests, checks, idempotent=True)
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
        if link.socket.poll(int(self.policy.timeout_s * 1000), zmq.POLLIN):
            reply = link.receive().header
            log.info("re-pushed round %d to %s: %s", round_, link.endpoint, type(reply).__name__)
        else:
            link.reopen()

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
    ) -> dict[int, object]:
        """Send ``requests[s]`` (encoded frames) to shard s; collect one reply per shard.

        Returns what ``checks[s]`` made of each reply. ``idempotent``: a resent request
        refused as DUPLICATE/STALE counts as accepted, with result None.
        """
        results: dict[int, object] = {}
        pending = set(requests)
        for attempt in range(self.policy.retries + 1):
            for s in pending:
                if attempt:
                    log.warning(
                        "no reply from %s in %.1f s; reconnecting (retry %d/%d)",
                        self.links[s].endpoint, self.policy.timeout_s, attempt,
                        self.policy.retries,
                    )
                    self.links[s].reopen()
                    if before_resend is not None:
                        before_resend(s)
                self.links[s].send(requests[s])
            try:
                self._collect(pending, results, checks, resent=idempotent and attempt > 0)
            except Exception:
                # replies still due would be read as answers to the next request
                for s in pending:
                    self.links[s].reopen()
                raise
            if not pending:
                return results
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
    ) -> None:
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
            for sock, _ in poller.poll(min(remaining_ms, WAIT_SLICE_MS)):
                s = by_socket[sock]
                endpoint = self.links[s].endpoint
                try:
                    msg = self.links[s].receive()
                except ProtocolError as exc:
                    raise PeerError(f"{endpoint} sent a malformed reply: {exc}") from exc
                header = msg.header
                if isinstance(header, Error):
                    if not _accepted_on_resend(header, resent):
                        if header.code == ErrorCode.CONFIG_MISMATCH.value:
                            raise ConfigError(f"{endpoint} refused: {header.message}")
                        raise ServerRefused(endpoint, header)
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
