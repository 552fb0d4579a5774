"""Per-peer budgets: how much refused traffic a peer is answered, and how much it is logged.

A key holder may send refused messages as fast as it likes. Each refusal costs the node
a reply and a log line, so both are budgeted per *principal* (the key's name; the
routing envelope's first frame when running without keys):

* :class:`RateLimit`: a token bucket per principal (``rate`` per second, ``burst`` at
  once); refusals beyond it are dropped without reply and counted;
* :class:`LogThrottle`: at most one line per principal and ``interval_s``; the next
  line says how many were not logged in between;
* :func:`excerpt`: text a peer controls (a field, a decoding error) on one line, its
  unprintable characters escaped, cut to a short prefix before it enters a log line or
  a reply; :func:`peer_repr`: a value a peer sent, shown so however deep it nests;
* :class:`PeerPolicy`: the above, the bars of keys that broke a hard limit and the
  counters of it all, as the server and the proxy cores both use them.

Both tables are bounded (least recently used out), so a stream of new principals (new
connections without keys) cannot grow them. Thread-safe.
"""

from __future__ import annotations

import logging
import reprlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from common.net.keys import Identity
    from common.net.transport import Incoming

REFUSALS_PER_S = 100.0
REFUSAL_BURST = 200.0
LOG_INTERVAL_S = 10.0
MAX_PRINCIPALS = 4096
EXCERPT_CHARS = 200


def principal_of(incoming: Incoming) -> Hashable:
    """Whom a message's budgets are charged to: its key, or, without keys, its
    connection. A proxy's key is one principal whatever envelope its messages name (the
    holder of the key picks the envelope frames); the server charges the sessions of
    workers whose HELLO through it carried their own end-to-end tag to (proxy, worker)
    instead (``ServerCore._principal``)."""
    identity = incoming.identity
    if identity is None:
        return bytes(incoming.envelope[0]) if incoming.envelope else b""
    return identity.name


def principal_name(principal: Hashable) -> str:
    """A principal as a log line names it."""
    if isinstance(principal, tuple):
        return f"{principal[0]} (relaying worker {principal[1]})"
    if isinstance(principal, bytes):
        return f"connection {principal[:8].hex()}"
    return str(principal)


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    """``str(text)`` cut to ``limit`` characters (a peer controls it), its line breaks,
    terminal escapes and other unprintable characters escaped (``\\n``, ``\\x1b``): a
    peer's text cannot make a log line of its own or drive the reader's terminal."""
    value = str(text)
    shown = value[:limit]
    if not shown.isprintable():
        shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                        for c in shown)
    if len(value) <= limit and len(shown) <= limit:
        return shown
    return f"{shown[:limit]}... ({len(value):,} characters)"


# repr() of a value a peer sent: a list nested a thousand deep (a HELLO of 1 KB) would
# raise RecursionError, and a long one would be rendered whole before being cut
_PEER_REPR = reprlib.Repr()
_PEER_REPR.maxlevel = 3
_PEER_REPR.maxstring = _PEER_REPR.maxother = EXCERPT_CHARS


def peer_repr(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` of a value a peer sent, shown to 3 levels of nesting and a few
    items of each, as :func:`excerpt` shows text."""
    return excerpt(_PEER_REPR.repr(value), limit)


_V = TypeVar("_V")


class _Bounded(OrderedDict[Hashable, _V], Generic[_V]):
    """An ordered dict that forgets its least recently used entries beyond ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def touch(self, key: Hashable, default: _V) -> _V:
        value = self.get(key)
        if value is None:
            value = self[key] = default
            while len(self) > self.limit:
                self.popitem(last=False)
        else:
            self.move_to_end(key)
        return value


class RateLimit:
    """A token bucket per principal: ``allow`` says whether one more event fits."""

    def __init__(self, rate: float = REFUSALS_PER_S, burst: float = REFUSAL_BURST,
                 limit: int = MAX_PRINCIPALS) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: _Bounded[list[float]] = _Bounded(limit)  # principal -> [tokens, time]
        self._lock = threading.Lock()

    def allow(self, principal: Hashable, now: float) -> bool:
        with self._lock:
            bucket = self._buckets.touch(principal, [self.burst, now])
            tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
            if tokens < 1.0:
                bucket[0] = tokens
                return False
            bucket[0] = tokens - 1.0
            return True


class LogThrottle:
    """At most one log line per principal per ``interval_s``."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, limit: int = MAX_PRINCIPALS) -> None:
        self.interval_s = interval_s
        # principal -> [time logged, lines held back since]
        self._last: _Bounded[list[float]] = _Bounded(limit)
        self._lock = threading.Lock()

    def admit(self, principal: Hashable, now: float) -> int | None:
        """None: do not log this one; else log it, mentioning the returned number of
        lines held back since the last one."""
        with self._lock:
            entry = self._last.touch(principal, [now - self.interval_s, 0])
            if now - entry[0] < self.interval_s:
                entry[1] += 1
                return None
            held, entry[0], entry[1] = entry[1], now, 0
            return int(held)  # (an int: a count, held in a list of floats)


# What a node counts about its peers' misconduct (STATUS counters, metrics).
BARRED = "barred"  # keys barred
CUT = "cut"  # connections cut in flight before any message named their key
FROM_BARRED = "from-barred"  # messages of a barred key, dropped
UNANSWERED = "unanswered"  # refusals beyond a peer's rate, dropped without reply


class PeerPolicy:
    """What a node (server or proxy core) does about a peer's misconduct, in one place.

    * refusals: counted by code, logged at most once per principal and interval (the
      peer's text cut short), answered within the principal's :class:`RateLimit`;
    * bars: a key that broke a hard limit is barred for the node's life (``on_bar``: the
      node's listener refuses its handshakes and cuts its connections); its messages
      are dropped and counted;
    * cuts: a connection the in-flight guard cut before any message named its key.
    """

    def __init__(self, counters: Counter[str], log: logging.Logger,
                 on_bar: Callable[[Identity, str], object] | None = None) -> None:
        self.counters = counters
        self.log = log
        self.on_bar = on_bar
        self.barred: dict[str, str] = {}  # key name -> why
        self.refusals = RateLimit()
        self.throttle = LogThrottle()

    def drops(self, identity: Identity | None) -> bool:
        """A message of ``identity`` is dropped unread (a barred key); counted."""
        if identity is None or identity.name not in self.barred:
            return False
        self.counters[FROM_BARRED] += 1
        return True

    def refuse(self, principal: Hashable, code: str, text: str, now: float,
               logged: bool = False) -> bool:
        """Count a refusal of code ``code`` and log it (unless ``logged``) within the
        throttle; whether to answer it (within the principal's rate)."""
        self.counters[code] += 1
        if not logged:
            held = self.throttle.admit(principal, now)
            if held is not None:
                self.log.warning("refused a message from %s: [%s] %s%s",
                                 principal_name(principal), code, excerpt(text),
                                 f" ({held} more refusals since the last line)" if held else "")
        if self.refusals.allow(principal, now):
            return True
        self.counters[UNANSWERED] += 1
        return False

    def loggable(self, what: str, principal: Hashable, now: float) -> int | None:
        """Whether a line about ``what`` (a HELLO, an internal error) of ``principal``
        may be logged now: None if not, else how many were held back since."""
        return self.throttle.admit((what, principal), now)

    def bar(self, identity: Identity, reason: str) -> bool:
        """Bar ``identity`` for the node's life; whether it was not barred before."""
        if identity.name in self.barred:
            return False
        self.barred[identity.name] = excerpt(reason)
        self.counters[BARRED] += 1
        self.log.warning("barred %s for the rest of the run: %s", identity.name,
                         excerpt(reason))
        if self.on_bar is not None:
            self.on_bar(identity, reason)
        return True

    def cut(self, reason: str, now: float) -> None:
        """The in-flight guard cut a connection with no key to bar: count and log it."""
        self.counters[CUT] += 1
        held = self.throttle.admit(CUT, now)
        if held is not None:
            self.log.warning("cut a connection (no key to bar): %s%s", reason,
                             f" ({held} more since the last line)" if held else "")
