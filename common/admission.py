"""Who may open a connection to a node now: the run's client keys, each within its budget.

A CURVE server's ZAP handler asks :meth:`Admission.admit` for every handshake. A key is
admitted only if it is one of the node's clients (the keys whose scope includes the
node's shard, ``common.keys``), is not barred, holds fewer than ``max_connections``
connections, and has not opened more than ``max_handshakes`` connections in the last
``window_s`` seconds (each handshake costs the node a few hundred microseconds of
cryptography, and each connection a socket and its buffers).

A connection counts against its key once a message from it has been delivered (the
in-flight guard, ``common/inflight.py``, attributes it by the message's ``User-Id``) until
it closes; a handshake not yet attributed counts for ``window_s`` seconds. A key that
broke a hard limit (an oversize or over-long message) is barred for the rest of the
node's life: its handshakes are refused from then on.

Thread-safe: the ZAP handler, the in-flight guard and the node's loop share one object.
Socket-free, with the clock as an argument, so every rule is unit tested.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass

from common.keys import Identity

# A worker needs one connection per server; a reconnect briefly holds two.
MAX_CONNECTIONS_PER_KEY = 4
# Handshakes a key may start per window (a worker reconnects a few times at most).
MAX_HANDSHAKES_PER_WINDOW = 20
HANDSHAKE_WINDOW_S = 10.0


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
                 window_s: float = HANDSHAKE_WINDOW_S) -> None:
        self.clients = dict(clients)
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.window_s = window_s
        self._lock = threading.Lock()
        self._live: Counter[Identity] = Counter()  # attributed connections open now
        self._handshakes: dict[Identity, deque[float]] = {}
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
            if self._live[identity] >= self.max_connections:
                return self._refuse(identity, "connections", f"already holds "
                                    f"{self._live[identity]} connections")
            if len(recent) >= self.max_handshakes:
                return self._refuse(identity, "handshakes", f"{len(recent)} handshakes in "
                                    f"{self.window_s:g} s")
            recent.append(now)
            return Decision(True, identity)

    def attach(self, identity: Identity) -> None:
        """A connection of ``identity`` delivered its first message: it counts now."""
        with self._lock:
            self._live[identity] += 1

    def detach(self, identity: Identity) -> None:
        """An attributed connection of ``identity`` closed."""
        with self._lock:
            self._live[identity] -= 1
            if self._live[identity] <= 0:
                del self._live[identity]

    def bar(self, identity: Identity, reason: str) -> bool:
        """Refuse ``identity``'s handshakes from now on; whether it is newly barred."""
        with self._lock:
            if identity in self._barred:
                return False
            self._barred[identity] = reason
            return True

    def is_barred(self, identity: Identity | None) -> bool:
        return identity is not None and identity in self._barred

    def barred(self) -> dict[str, str]:
        """The barred keys by name, with why."""
        with self._lock:
            return {i.name: why for i, why in self._barred.items()}

    def connections(self, identity: Identity) -> int:
        """Attributed connections of ``identity`` open now."""
        with self._lock:
            return self._live[identity]

    def _recent(self, identity: Identity, now: float) -> deque[float]:
        """``identity``'s handshakes of the last window (older ones dropped)."""
        recent = self._handshakes.setdefault(identity, deque())
        while recent and now - recent[0] > self.window_s:
            recent.popleft()
        return recent

    def _refuse(self, identity: Identity, kind: str, reason: str) -> Decision:
        self.refused[kind] += 1
        return Decision(False, identity, reason)
