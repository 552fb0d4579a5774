"""The only code that touches ZeroMQ sockets for the server, the proxy and the clients.

* sockets: one configuration for all (inbound frame limit, linger, copy threshold);
  a ROUTER that binds and announces its endpoint in a ready file; a DEALER that
  connects;
* envelopes: a ROUTER sees ``[routing envelope..., b"", header, chunks...]``; the
  envelope (one identity per hop) is opaque and travels back with every reply; the
  replies that share one message (a round's PARAMS) are encoded and copied once
  (:func:`send_all`);
* receive-decode-or-report: :func:`receive` returns an :class:`Incoming` holding either
  the decoded message or the :class:`ProtocolError` that refused it, never raises for
  what a peer sent; the node's core decides what to answer and counts it. It takes a
  message frame by frame and keeps nothing of one larger than the node's largest legal
  message (libzmq itself assembles a whole multipart message before delivering it; each
  frame is bounded by ``MAXMSGSIZE``, a larger one disconnects the peer);
* security: with keys a ROUTER is a CURVE server whose ZAP handler admits only the
  node's client keys (by scope, ``common.net.keys``), each within its budget
  (``common/net/admission.py``: not barred, a few connections, a handshake rate), and labels
  each connection with the key's identity (``User-Id``), which :func:`receive` reports;
  ZAP is enforced (no handler: no connection). A DEALER is a CURVE client that checks
  the server's key. Without keys (``--insecure``) both speak plain ZMTP;
* a :class:`Listener` is a bound ROUTER with all of that, plus the in-flight guard
  (``common/net/inflight.py``) that cuts a connection holding more than a few legal messages'
  worth of an unfinished one, and the bars of keys that broke a hard limit.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import zmq
from zmq.utils import z85

from common.errors import ConfigError
from common.net.admission import Admission
from common.net.budgets import LogThrottle
from common.net.inflight import (
    InflightGuard,
    bare_bounds,
    hold_limit,
    tcp_info_available,
    wire_bytes,
)
from common.net.keys import CurveClient, CurveServer, Identity
from common.net.protocol import (
    CHUNK_BYTES,
    ITEM_BYTES,
    MAX_FRAME_BYTES,
    MAX_HEADER_BYTES,
    ErrorCode,
    Header,
    Message,
    ProtocolError,
    decode,
    encode,
    join_envelope,
    split_envelope,
)

# Frames below this are copied when sent even with copy=False. Zero-copy sends hand
# each frame's release to pyzmq's garbage-collector thread (a thread wake-up and a
# GIL hand-off per frame), which costs more than copying a frame of a few hundred KB;
# it pays off only for large frames.
ZERO_COPY_MIN_BYTES = 1 << 20
LINGER_MS = 1000
# Complete messages a ROUTER queues per connection before it stops reading from it (TCP
# back-pressure): with the in-flight guard this bounds what one connection can make a
# node hold. A worker has one request out per server; a proxy relays n, which wait in
# the kernel's buffers a moment longer.
RECEIVE_HWM = 4
# Replies a ROUTER queues per connection for a peer that does not read them (beyond, it
# drops them): a proxy's one connection carries the replies of all n workers behind it.
SEND_HWM_MIN = 16
# A legal envelope has one routing id per hop (worker -> proxy -> server: 2); ZeroMQ
# generates 5-byte ids and allows at most 255 bytes.
MAX_ENVELOPE_DEPTH = 4
ZAP_DOMAIN = "ps"  # each bound ROUTER gets its own domain: ps-1, ps-2, ...
MAX_ROUTING_ID_BYTES = 255
# libzmq applies MAXMSGSIZE to a frame as it arrives, before CURVE decrypts it: the
# MESSAGE command wraps each frame in its name, flags, nonce and MAC (33 bytes), so a
# chunk of exactly CHUNK_BYTES would otherwise disconnect its sender (a shard of 1M+
# values could never be pushed or pulled with keys). Rounded up generously.
CURVE_FRAME_OVERHEAD = 256
INBOUND_FRAME_LIMIT = MAX_FRAME_BYTES + CURVE_FRAME_OVERHEAD
# What a received frame costs a node besides its bytes (libzmq's message and pyzmq's Frame
# object): a message of a million empty frames is as large as its frames are many.
FRAME_COST = 64

# What relaying a message one hop further adds to it at the next node: the routing id of
# the relay's own connection there (ZeroMQ's are 5 bytes, at most MAX_ROUTING_ID_BYTES)
# and its frame. A relay refuses what this would take past the next node's limit.
RELAY_HOP_BYTES = MAX_ROUTING_ID_BYTES + FRAME_COST

Peer = tuple[bytes, ...]
"""A peer as a node sees it: its routing envelope, hashable."""

log = logging.getLogger("ps.transport")


@dataclass
class Incoming:
    """One received message: its envelope and either the message or why it is unusable."""

    envelope: list[Any]
    message: Message | None
    error: ProtocolError | None
    frames: list[Any]
    size: int
    identity: Identity | None = None  # the CURVE key that sent it (None: no keys in use)
    fd: int = -1  # the descriptor of the connection it came on (zmq.SRCFD)
    wire: int = 0  # bytes its frames took on the wire, kept or not (``wire_bytes``)

    @cached_property
    def peer(self) -> Peer:
        return tuple(bytes(f) for f in self.envelope)


class Outbound(Protocol):
    """A message to send behind an envelope (``server.core.Reply``)."""

    @property
    def envelope(self) -> Sequence[Any]: ...
    @property
    def header(self) -> Header: ...
    @property
    def tensor(self) -> np.ndarray | Sequence[np.ndarray] | None: ...


def largest_message(length: int, item_bytes: int = ITEM_BYTES) -> int:
    """What the largest legal message for a server process of ``length`` values (its
    shards' together) of ``item_bytes`` each costs a node (:func:`receive`): its header,
    values and envelope, and ``FRAME_COST`` per frame (a sender splitting the values at
    the shards' spans adds a frame or two, well within the header's bound). The pushes of
    a run with bfloat16 on the wire are sized as such (``item_bytes`` 2): a budget of
    float32's would leave room for a hundred thousand tiny frames."""
    chunks = max(1, -(-item_bytes * length // CHUNK_BYTES))
    frames = MAX_ENVELOPE_DEPTH + 2 + chunks  # envelope, delimiter, header, chunks
    return (MAX_HEADER_BYTES + item_bytes * length
            + MAX_ENVELOPE_DEPTH * MAX_ROUTING_ID_BYTES + FRAME_COST * frames)


def configure(sock: zmq.Socket, linger_ms: int = LINGER_MS) -> zmq.Socket:
    """Inbound frame limit (a larger frame disconnects the peer), linger, copy threshold."""
    sock.setsockopt(zmq.MAXMSGSIZE, INBOUND_FRAME_LIMIT)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.copy_threshold = ZERO_COPY_MIN_BYTES
    return sock


def write_ready_file(path: Path | None, endpoint: str) -> None:
    """Announce the endpoint a socket was bound to (atomically: readers never see half)."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(endpoint + "\n", encoding="utf-8")
    os.replace(tmp, path)


def bind_router(ctx: zmq.Context, endpoint: str, curve: CurveServer | None = None,
                admission: Admission | None = None) -> tuple[zmq.Socket, str]:
    """A configured ROUTER bound to ``endpoint``, and the endpoint it got (``tcp://h:*``);
    a CURVE server admitting ``curve.clients`` when ``curve`` is given, by the rules of
    ``admission`` (default: those clients, with the default budgets).

    A routing id never moves from one connection to another (no ``ROUTER_HANDOVER``: a
    peer guessing another's id cannot take over its replies)."""
    sock = configure(ctx.socket(zmq.ROUTER))
    sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    if curve is not None:
        domain = _gate(ctx).register(admission or Admission(curve.clients))
        sock.curve_secretkey = curve.secret
        sock.curve_publickey = curve.public
        sock.curve_server = True
        sock.zap_domain = domain.encode()
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP handler: no connection
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(f"cannot bind {endpoint}: {exc}") from exc
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_dealer(ctx: zmq.Context, endpoint: str, linger_ms: int = LINGER_MS,
                   curve: CurveClient | None = None,
                   max_frame: int | None = None) -> zmq.Socket:
    """A configured DEALER connected to ``endpoint`` (a CURVE client with ``curve``);
    ``max_frame``: a lower inbound frame limit than the default (a larger frame
    disconnects the peer)."""
    sock = configure(ctx.socket(zmq.DEALER), linger_ms)
    if max_frame is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, min(INBOUND_FRAME_LIMIT, max_frame))
    if curve is not None:
        sock.curve_secretkey = curve.secret
        sock.curve_publickey = curve.public
        sock.curve_serverkey = curve.server
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(f"cannot connect to {endpoint}: {exc}") from exc
    return sock


def receive(sock: zmq.Socket, max_bytes: int | None = None,
            authenticated: bool = False) -> Incoming:
    """The next message of ``sock``, decoded, or the reason it could not be.

    A message costing more than ``max_bytes`` (its bytes and ``FRAME_COST`` per frame) is
    read to its end but not kept (only its envelope, to answer). ``authenticated``: the
    socket is a CURVE server, whose messages carry the identity of the key that sent
    them (a message without one is refused, ``forbidden``).
    """
    frames: list[Any] = []
    size = wire = cost = count = 0
    too_large = False
    while True:
        frame = sock.recv(copy=False)
        length = len(frame)
        size += length
        count += 1
        cost += length + FRAME_COST
        wire += wire_bytes(length, authenticated)
        if max_bytes is not None and cost > max_bytes and not too_large:
            too_large = True
            frames = _envelope_part(frames)
        if not too_large:
            frames.append(frame)
        if not frame.more:
            break
    fd = frames[0].get(zmq.SRCFD) if frames else -1
    identity = None
    if authenticated and frames:
        identity = _identity(frames[0])
        if identity is None:  # a CURVE server's messages always name their key
            error = ProtocolError("no authenticated key", ErrorCode.FORBIDDEN)
            return Incoming(frames[:1], None, error, frames, size, None, fd, wire)
    if too_large:
        error = ProtocolError(f"message of {size:,} bytes in {count:,} frames, larger than "
                              f"any legal message here ({max_bytes:,} bytes, a frame "
                              f"counting {FRAME_COST})", ErrorCode.TOO_LARGE)
        return Incoming(frames, None, error, frames, size, identity, fd, wire)
    try:
        envelope, body = split_envelope(frames)
    except ProtocolError as exc:
        # without a delimiter the reply route is unknown: the first frame is the
        # peer's identity on a ROUTER, so answer there if there is one
        return Incoming(list(frames[:1]), None, exc, list(frames), size, identity, fd, wire)
    if len(envelope) > MAX_ENVELOPE_DEPTH or any(len(f) > MAX_ROUTING_ID_BYTES
                                                 for f in envelope):
        error = ProtocolError(f"routing envelope of {len(envelope)} frames (at most "
                              f"{MAX_ENVELOPE_DEPTH} of {MAX_ROUTING_ID_BYTES} bytes)")
        return Incoming(envelope[:1], None, error, list(frames), size, identity, fd, wire)
    try:
        return Incoming(envelope, decode(body), None, list(frames), size, identity, fd, wire)
    except ProtocolError as exc:
        return Incoming(envelope, None, exc, list(frames), size, identity, fd, wire)


def _identity(frame: zmq.Frame) -> Identity | None:
    """The identity of the key that sent ``frame`` (its ``User-Id``); None if absent."""
    try:
        return Identity.parse(frame.get("User-Id"))
    except zmq.ZMQError:
        return None


def _envelope_part(frames: list[Any]) -> list[Any]:
    """The routing envelope of a message's first frames (or its first frame)."""
    for i, f in enumerate(frames):
        if len(f) == 0:
            return frames[: min(i, MAX_ENVELOPE_DEPTH)]
    return frames[:1]


def send(sock: zmq.Socket, envelope: Sequence[Any], header: Header,
         tensor: np.ndarray | Sequence[np.ndarray] | None = None) -> None:
    """Send ``header`` (and its tensor) behind ``envelope``."""
    send_frames(sock, join_envelope(envelope, encode(header, tensor)))


# Large replies (sent without a copy) a principal's connections may leave untaken: each
# keeps its round's arrays alive until it is sent or dropped. An honest peer has one or
# two in flight; a peer that never reads could otherwise pin one array per reply queued.
REPLIES_HELD = 4


class ReplyLedger:
    """The bytes of large replies each principal has not taken yet, bounded per
    principal: ``principal_of(envelope)`` names whom a reply goes to (None: not
    counted), ``budget`` bytes each, ``on_drop(principal)`` for a reply dropped instead
    of sent. A reply is taken once libzmq has released its frames (their trackers):
    sent, or dropped with its connection. Only frames of ``ZERO_COPY_MIN_BYTES`` or more
    are counted (smaller ones are copied into libzmq's queue, bounded by ``SNDHWM``)."""

    def __init__(self, principal_of: Callable[[Sequence[Any]], Hashable | None], budget: int,
                 on_drop: Callable[[Hashable], None]) -> None:
        self.principal_of = principal_of
        self.budget = budget
        self.on_drop = on_drop
        self._held: dict[Hashable, list[tuple[zmq.MessageTracker, int]]] = {}

    def held(self, principal: Hashable) -> int:
        """Bytes ``principal`` has not taken yet (forgetting what it has)."""
        entries = [e for e in self._held.get(principal, ()) if not e[0].done]
        if entries:
            self._held[principal] = entries
        else:
            self._held.pop(principal, None)
        return sum(size for _, size in entries)

    def send(self, sock: zmq.Socket, envelope: Sequence[Any], frames: Sequence[Any],
             large: int) -> bool:
        """Send ``frames``, of which ``large`` bytes in frames of ``ZERO_COPY_MIN_BYTES``
        or more, behind ``envelope`` unless that exceeds its principal's budget (then
        ``on_drop``); whether it was sent."""
        principal = self.principal_of(envelope)
        if principal is None:
            send_frames(sock, join_envelope(envelope, frames))
            return True
        if self.held(principal) + large > self.budget:
            self.on_drop(principal)
            return False
        out = join_envelope(envelope, frames)
        last = len(out) - 1
        trackers = []
        for i, frame in enumerate(out):
            flags = _MORE if i < last else 0
            if _nbytes(frame) >= ZERO_COPY_MIN_BYTES:  # a received frame: by its memory
                data = frame.buffer if isinstance(frame, zmq.Frame) else frame
                trackers.append(sock.send(data, flags, copy=False, track=True))
            else:
                sock.send(frame, flags, copy=False)
        self._held.setdefault(principal, []).append((zmq.MessageTracker(*trackers), large))
        return True


def _nbytes(frame: Any) -> int:
    return frame.nbytes if hasattr(frame, "nbytes") else len(frame)


def large_bytes(frames: Sequence[Any]) -> int:
    """Bytes in the frames that are sent without a copy (``ZERO_COPY_MIN_BYTES`` or more)."""
    return sum(size for size in map(_nbytes, frames) if size >= ZERO_COPY_MIN_BYTES)


def send_all(sock: zmq.Socket, messages: Sequence[Outbound],
             ledger: ReplyLedger | None = None) -> None:
    """Send each message behind its envelope, in order, as :func:`send` does.

    Messages sharing one header object and one tensor object (a round's PARAMS to every
    PULL parked for it) are encoded once, and their frames made ZeroMQ messages once,
    which every send of them references: a frame below ``ZERO_COPY_MIN_BYTES`` is copied
    then (the arrays may change afterwards), a larger one shares the arrays' memory, as
    :func:`send` would. With a ``ledger`` the large ones are counted against their
    principal's budget instead, each send its own zero-copy message of the same memory
    (:class:`ReplyLedger`)."""
    uses = Counter((id(m.header), id(m.tensor)) for m in messages)
    shared: dict[tuple[int, int], list[zmq.Frame]] = {}
    encoded: dict[tuple[int, int], tuple[list[Any], int]] = {}
    for m in messages:
        key = (id(m.header), id(m.tensor))
        if ledger is not None and m.tensor is not None:
            if key not in encoded:
                frames = encode(m.header, m.tensor)
                encoded[key] = frames, large_bytes(frames)
            frames, large = encoded[key]
            if large:
                ledger.send(sock, m.envelope, frames, large)
                continue
        if uses[key] == 1:
            send(sock, m.envelope, m.header, m.tensor)
            continue
        body = shared.get(key)
        if body is None:
            frames = encoded[key][0] if key in encoded else encode(m.header, m.tensor)
            body = shared[key] = [zmq.Frame(f, copy_threshold=ZERO_COPY_MIN_BYTES)
                                  for f in frames]
        send_frames(sock, join_envelope(m.envelope, body))


_MORE = int(zmq.SNDMORE)

# ZeroMQ I/O threads of a server or proxy process with keys. Each connection's CURVE
# encryption runs on the I/O thread that owns it: with one, a server encrypts the round's
# PARAMS for every worker process, and decrypts the n pushes, one after another on one
# core while the other waits (measured here at S=4 on one server process: the values
# reached four worker processes 6.5 ms after the round closed with one, 3.5-4.5 ms with
# two; 3-5% more rounds/s).
CURVE_IO_THREADS = 2


def node_context(curve: bool) -> zmq.Context:
    """The process's ZeroMQ context, with ``CURVE_IO_THREADS`` I/O threads if its bound
    socket speaks CURVE (``curve``), else one (plain frames: a copy, no cipher)."""
    return zmq.Context.instance(io_threads=CURVE_IO_THREADS if curve else 1)


def send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0) -> None:
    """Send frames as one message (as ``send_multipart(copy=False)``, without its
    per-frame type checks and flag enums: this runs for every message of a round)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, flags | _MORE if i < last else flags, copy=False)


class _Gate:
    """The ZAP handler of a context: one domain per bound ROUTER, each with its
    :class:`Admission`; refused handshakes are logged at most once per key and
    interval."""

    _domains = itertools.count(1)

    def __init__(self, ctx: zmq.Context) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self.admissions: dict[str, Admission] = {}
        self.names: dict[bytes, str] = {}
        self.throttle = LogThrottle()
        gate = self

        class Named(ThreadAuthenticator):
            def curve_user_id(self, client_public_key: bytes) -> str:
                return gate.names[z85.encode(client_public_key)]

        self.thread = Named(ctx)
        self.thread.start()

    def register(self, admission: Admission) -> str:
        """A new ZAP domain whose handshakes ``admission`` decides."""
        domain = f"{ZAP_DOMAIN}-{next(self._domains)}"
        self.admissions[domain] = admission
        self.names.update({k: i.name for k, i in admission.clients.items()})
        self.thread.configure_curve_callback(domain=domain, credentials_provider=self)
        return domain

    def callback(self, domain: str, key: bytes) -> bool:
        """(In the ZAP thread.) Admit the handshake of ``key`` at ``domain``?"""
        admission = self.admissions.get(domain)
        if admission is None:
            return False
        decision = admission.admit(key, time.monotonic())
        if not decision.admitted:
            who = decision.identity.name if decision.identity else "an unknown key"
            held = self.throttle.admit(who, time.monotonic())
            if held is not None:
                log.warning("refused a connection of %s: %s%s", who, decision.reason,
                            f" ({held} more refused since the last line)" if held else "")
        return decision.admitted


_gates: dict[int, _Gate] = {}
_gates_lock = threading.Lock()


def _gate(ctx: zmq.Context) -> _Gate:
    """``ctx``'s ZAP handler, started on first use."""
    with _gates_lock:
        gate = _gates.get(id(ctx))
        if gate is None:
            gate = _gates[id(ctx)] = _Gate(ctx)
        return gate


class Listener:
    """A bound ROUTER and its guards: the ZAP handler's :class:`Admission` (with keys),
    the in-flight guard, and the bars of keys that broke a hard limit.

    ``largest`` is the largest legal message here (:func:`largest_message`): a larger one
    is read to its end and refused (``too-large``), and a connection may hold at most a
    few of them before its messages are delivered (``common/net/inflight.py``; one before its
    first message). The key of a connection the guard cut for an over-long message is
    barred at once (its next handshake is refused); the offence waits in
    :meth:`offences` for the node's loop, which records it. Replies
    queued for a connection whose peer does not read them are bounded by ``SNDHWM``:
    ``SEND_HWM_MIN`` plus two per peer that may share the connection
    (``peers_per_connection``: n at a server, whose proxy relays all the workers).
    ``clients``: the honest connections that may come at once (n workers, each with its
    own connection, and a few more), which the bounds on connections before a handshake
    leave room for, from one host (a local cluster) or in all (``inflight.bare_bounds``).
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, curve: CurveServer | None,
                 largest: int, peers_per_connection: int = 1, clients: int = 0) -> None:
        self.admission = Admission(curve.clients) if curve is not None else None
        self.sock, self.endpoint = bind_router(ctx, endpoint, curve, self.admission)
        self.sock.setsockopt(zmq.SNDHWM, SEND_HWM_MIN + 2 * peers_per_connection)
        self.largest = largest
        self.ledger: ReplyLedger | None = None  # the node's, if it bounds replies' bytes
        self._offences: deque[tuple[Identity | None, str]] = deque()
        self.guard = InflightGuard(
            self.sock, limit=hold_limit(largest, RECEIVE_HWM, INBOUND_FRAME_LIMIT),
            first_limit=hold_limit(largest, 0, INBOUND_FRAME_LIMIT),
            curve=curve is not None, tcp_info=tcp_info_available(self.endpoint),
            on_offence=self._offended,
            max_connections=self.admission.max_connections if self.admission else None,
            on_named=self._named, bare=bare_bounds(clients))
        if self.admission is not None:
            self.admission.live = self.guard.connections

    def _named(self, identity: Identity, age_s: float) -> None:
        if self.admission is not None:
            self.admission.named(identity, time.monotonic(), age_s)

    def _offended(self, identity: Identity | None, why: str) -> None:
        """(In the guard's thread.) Bar the key now, so its next handshake is refused
        even before the node's loop records the offence."""
        if identity is not None and self.admission is not None:
            self.admission.bar(identity, why)
        self._offences.append((identity, why))

    def receive(self) -> Incoming:
        """The next message (see :func:`receive`), accounted to its connection."""
        curve = self.admission is not None
        incoming = receive(self.sock, self.largest, authenticated=curve)
        # the routing id frame is the ROUTER's own, never on the wire
        routing_id = wire_bytes(len(incoming.frames[0]), curve) if incoming.frames else 0
        self.guard.delivered(incoming.fd, incoming.identity, incoming.wire - routing_id)
        return incoming

    def send_all(self, messages: Sequence[Outbound]) -> None:
        """Send ``messages``, each encoded once however many share it (:func:`send_all`),
        the large ones within their principal's budget if the node gave a ``ledger``."""
        send_all(self.sock, messages, self.ledger)

    def offences(self) -> list[tuple[Identity | None, str]]:
        """The connections the guard cut since the last call: (key or None, why)."""
        out = []
        while self._offences:
            out.append(self._offences.popleft())
        return out

    def bar(self, identity: Identity, reason: str) -> bool:
        """Refuse ``identity``'s handshakes from now on and cut its connections; whether
        it was not barred before."""
        if self.admission is None:
            return False
        newly = self.admission.bar(identity, reason)
        self.guard.cut_all(identity)
        return newly

    def close(self, linger_ms: int = LINGER_MS) -> None:
        self.guard.close()
        self.sock.close(linger=linger_ms)


def shut_down(ctx: zmq.Context, linger_ms: int = LINGER_MS) -> None:
    """Stop ``ctx``'s ZAP handler, close its sockets and terminate it, so that what is
    still queued for a peer (the last round's replies) goes out within ``linger_ms``
    instead of dying with the process (``os._exit`` or a quick interpreter exit would
    drop it)."""
    with _gates_lock:
        gate = _gates.pop(id(ctx), None)
    if gate is not None:
        gate.thread.stop()
    ctx.destroy(linger=linger_ms)
