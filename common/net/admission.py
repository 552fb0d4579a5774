"""Who may open a connection to a node now: the run's client keys, each within its budget.

A CURVE server's ZAP handler asks :meth:`Admission.admit` for every handshake. A key is
admitted only if it is one of the node's clients (the keys whose scope includes the
node's shard, ``common.net.keys``), is not barred, holds fewer than ``max_connections``
connections, and has started fewer than ``max_handshakes`` in the last ``window_s``
seconds (each handshake costs the node a few hundred microseconds of cryptography, and
each connection a socket and its buffers).

A key's connections are those the in-flight guard (``common/net/inflight.py``) has
attributed to it by a delivered message (``live``, which the guard provides), plus its
handshakes of the last ``pending_s`` seconds that no message has named yet (the guard
reports each attribution, :meth:`Admission.named`): the guard cuts a connection that has
delivered nothing after ``pending_s`` (``IDLE_CUT_S``), so no connection is ever
uncounted, and none is counted twice, so a worker that reopened its socket a few times
(one per request timeout, under load) is never refused for connections it closed. A key that broke a
hard limit (an oversize or over-long message) is barred for the rest of the node's
life: its handshakes are refused from then on.

Thread-safe: the ZAP handler, the in-flight guard and the node's loop share one object.
Socket-free, with the clock as an argument, so every rule is unit tested.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from common.net.keys import Identity

# A worker needs one connection per server; a reconnect briefly holds two.
MAX_CONNECTIONS_PER_KEY = 4
# Handshakes a key may start per window (a worker reconnects a few times at most).
MAX_HANDSHAKES_PER_WINDOW = 20
HANDSHAKE_WINDOW_S = 10.0
# How long a handshake counts as a connection without a message naming it: the guard
# cuts a connection that delivered nothing for as long (IDLE_CUT_S).
PENDING_S = 10.0


@dataclass(frozen=True)
class Decision:
    """Whether a handshake is admitted, and why not (for the log)."""

    admitted: bool
    identity: Identity | None
    reason: str = ""


class Admission:
    """The ZAP handler's rules for one node's clients (see the module docstring)."""

    def __init__(self, clients: dict[bytes, Identity],
                 max_connections: int = MAX_CONNECTIONS_PER_KEY,
                 max_handshakes: int = MAX_HANDSHAKES_PER_WINDOW,
                 window_s: float = HANDSHAKE_WINDOW_S, pending_s: float = PENDING_S) -> None:
        self.clients = dict(clients)
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.window_s = window_s
        self.pending_s = pending_s
        # attributed connections of a key open now (the in-flight guard's count)
        self.live: Callable[[Identity], int] = lambda identity: 0
        self._lock = threading.Lock()
        self._handshakes: dict[Identity, deque[float]] = {}
        self._unnamed: dict[Identity, deque[float]] = {}  # admitted, no message yet
        self._barred: dict[Identity, str] = {}
        self.refused: Counter[str] = Counter()  # by reason: barred, connections, handshakes

    def admit(self, public_key: bytes, now: float) -> Decision:
        """Decide on a handshake by the client key ``public_key`` (z85)."""
        identity = self.clients.get(public_key)
        if identity is None:
            return Decision(False, None, "not a key of this node's clients")
        with self._lock:
            if identity in self._barred:
                return self._refuse(identity, "barred", f"barred: {self._barred[identity]}")
            recent = self._recent(identity, now)
            unnamed = self._pending(identity, now)
            held = self.live(identity) + len(unnamed)
            if held >= self.max_connections:
                return self._refuse(identity, "connections", f"holds {held} connections")
            if len(recent) >= self.max_handshakes:
                return self._refuse(identity, "handshakes", f"{len(recent)} handshakes in "
                                    f"{self.window_s:g} s")
            recent.append(now)
            unnamed.append(now)
            return Decision(True, identity)

    def named(self, identity: Identity, now: float, age_s: float = 0.0) -> None:
        """A message named one of ``identity``'s connections, accepted ``age_s`` ago (the
        guard attributed it): it counts in ``live`` from now on, not as a pending
        handshake as well. A connection older than ``pending_s`` has no pending entry
        left, and takes none of a newer connection's."""
        if age_s >= self.pending_s:
            return
        with self._lock:
            pending = self._pending(identity, now)
            if pending:
                pending.popleft()

    def bar(self, identity: Identity, reason: str) -> bool:
        """Refuse ``identity``'s handshakes from now on; whether it is newly barred."""
        with self._lock:
            if identity in self._barred:
                return False
            self._barred[identity] = reason
            return True

    def _recent(self, identity: Identity, now: float) -> deque[float]:
        """``identity``'s handshakes of the last window (older ones dropped)."""
        recent = self._handshakes.setdefault(identity, deque())
        while recent and now - recent[0] > self.window_s:
            recent.popleft()
        return recent

    def _pending(self, identity: Identity, now: float) -> deque[float]:
        """``identity``'s admitted handshakes of the last ``pending_s`` that no message
        named yet (older ones dropped: the guard has cut those connections)."""
        pending = self._unnamed.setdefault(identity, deque())
        while pending and now - pending[0] >= self.pending_s:
            pending.popleft()
        return pending

    def _refuse(self, identity: Identity, kind: str, reason: str) -> Decision:
        self.refused[kind] += 1
        return Decision(False, identity, reason)
