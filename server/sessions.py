"""Who may do what on a server: the peers that said HELLO, bounded per principal and in total.

A peer (a routing envelope) must HELLO with the run's settings before it may PUSH or
PULL; the HELLO opens a session that binds the peer to its role and worker id, so a
session opened as worker i can push only as worker i. With CURVE keys every message must
be within the scope of the key that authenticated the connection (``common.net.scopes``):
a proxy's key, only at the server process it fronts, may say HELLO as the proxy itself and relay
the HELLOs of the workers behind it (relayed messages carry the proxy's routing frame),
each with its worker's end-to-end tag, as each relayed push header (:class:`RelayTags`).

The table is bounded twice, so no peer can fill it for the others: each principal (the
authenticated key, the role and the worker id claimed) keeps at most
``MAX_SESSIONS_PER_PRINCIPAL`` sessions, its oldest going first (a worker that
reconnects gets a new routing id each time); and all principals together at most
``MAX_SESSIONS``, the least recently used going first. An evicted peer is told to HELLO
again (``hello-first``), which the client does by itself.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.net.keys import Identity
from common.net.protocol import ErrorCode, Hello, Push, Refused
from common.net.relay_auth import hello_tag, push_tag, tags_equal

if TYPE_CHECKING:
    from common.net.transport import Peer

MAX_SESSIONS = 1024
MAX_SESSIONS_PER_PRINCIPAL = 4


@dataclass(frozen=True)
class Session:
    """A peer's HELLO: its role and worker id, and the key it authenticated with."""

    role: str
    worker: int
    identity: Identity | None
    nonce: str = ""  # a relayed worker's session nonce, which its push tags cover

    @property
    def principal(self) -> tuple[str | None, str, int]:
        return (self.identity.name if self.identity else None, self.role, self.worker)

    @property
    def relayed(self) -> bool:
        """Opened through a proxy: the worker's own tags vouch for what it sends."""
        return self.identity is not None and self.identity.role == "proxy"


class RelayTags:
    """Checks the end-to-end tags (``common/net/relay_auth.py``) of the HELLOs and pushes a
    proxy relays to server process ``server``: a proxy's key carries only what a worker
    sent, never opens a session for a worker that did not connect through it, never
    pushes a round the worker did not push. ``key(worker)``: the key the server shares
    with that worker (computed once each)."""

    def __init__(self, config_hash: str, server: int, key: Callable[[int], bytes]) -> None:
        self.config_hash = config_hash
        self.server = server
        self._key = functools.lru_cache(maxsize=None)(key)

    def check_hello(self, hello: Hello) -> None:
        """FORBIDDEN unless ``hello`` carries worker ``hello.worker``'s tag for this server."""
        expected = hello_tag(self._key(hello.worker), self.config_hash, hello.worker,
                             self.server, hello.nonce)
        if not hello.nonce or not tags_equal(hello.tag, expected):
            raise Refused(ErrorCode.FORBIDDEN, f"a relayed HELLO as worker {hello.worker} "
                          "without that worker's end-to-end tag: a proxy carries only what "
                          "a worker sent")

    def check_push(self, push: Push, nonce: str) -> None:
        """FORBIDDEN unless ``push``'s header carries its worker's tag for this session."""
        expected = push_tag(self._key(push.worker), self.config_hash, push.worker,
                            self.server, nonce, push.round, push.length, push.dtype)
        if not tags_equal(push.tag, expected):
            raise Refused(ErrorCode.FORBIDDEN, f"a relayed push of round {push.round} as "
                          f"worker {push.worker} without that worker's end-to-end tag")


class Sessions:
    """The open sessions of one server, bounded; least recently used first out."""

    def __init__(self, limit: int = MAX_SESSIONS,
                 per_principal: int = MAX_SESSIONS_PER_PRINCIPAL) -> None:
        self.limit = limit
        self.per_principal = per_principal
        self._by_peer: OrderedDict[Peer, Session] = OrderedDict()
        self._by_principal: dict[tuple, list[Peer]] = {}

    def __len__(self) -> int:
        return len(self._by_peer)

    def __contains__(self, peer: Peer) -> bool:
        return peer in self._by_peer

    def open(self, peer: Peer, session: Session) -> list[Peer]:
        """Open (or renew) ``peer``'s session; the peers evicted to make room."""
        evicted = []
        if peer in self._by_peer:
            self._drop(peer)
        peers = self._by_principal.setdefault(session.principal, [])
        while len(peers) >= self.per_principal:
            evicted.append(peers[0])
            self._drop(peers[0])
        while len(self._by_peer) >= self.limit:
            oldest = next(iter(self._by_peer))
            evicted.append(oldest)
            self._drop(oldest)
        self._by_peer[peer] = session
        self._by_principal.setdefault(session.principal, []).append(peer)
        return evicted

    def peers_of(self, session: Session) -> list[Peer]:
        """The peers with a session of ``session``'s principal, oldest first."""
        return list(self._by_principal.get(session.principal, ()))

    def get(self, peer: Peer) -> Session | None:
        """``peer``'s session, if it has one (its recent use not marked)."""
        return self._by_peer.get(peer)

    def require(self, peer: Peer) -> Session:
        """``peer``'s session (marked as recently used); HELLO_FIRST if it has none."""
        session = self._by_peer.get(peer)
        if session is None:
            raise Refused(ErrorCode.HELLO_FIRST, "send HELLO (with the run's settings) first")
        self._by_peer.move_to_end(peer)
        return session

    def _drop(self, peer: Peer) -> None:
        session = self._by_peer.pop(peer)
        peers = self._by_principal[session.principal]
        peers.remove(peer)
        if not peers:
            del self._by_principal[session.principal]
