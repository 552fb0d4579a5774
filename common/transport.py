"""The only code that touches ZeroMQ sockets for the server, the proxy and the clients.

* sockets: one configuration for all (inbound frame limit, linger, copy threshold);
  a ROUTER that binds and announces its endpoint in a ready file; a DEALER that
  connects;
* envelopes: a ROUTER sees ``[routing envelope..., b"", header, chunks...]``; the
  envelope (one identity per hop) is opaque and travels back with every reply;
* receive-decode-or-report: :func:`receive` returns an :class:`Incoming` holding either
  the decoded message or the :class:`ProtocolError` that refused it, never raises for
  what a peer sent; the node's core decides what to answer and counts it. It takes a
  message frame by frame and keeps nothing of one larger than the node's largest legal
  message (libzmq itself assembles a whole multipart message before delivering it; each
  frame is bounded by ``MAXMSGSIZE``, a larger one disconnects the peer);
* security: with keys a ROUTER is a CURVE server whose ZAP handler admits only the
  run's client keys and labels each connection with the key's identity (``User-Id``),
  which :func:`receive` reports; a DEALER is a CURVE client that checks the server's
  key. Without keys (``--insecure``) both speak plain ZMTP.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.utils import z85

from common.errors import ConfigError
from common.keys import CurveClient, CurveServer, Identity
from common.protocol import (
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
# A legal envelope has one routing id per hop (worker -> proxy -> server: 2); ZeroMQ
# generates 5-byte ids and allows at most 255 bytes.
MAX_ENVELOPE_DEPTH = 4
ZAP_DOMAIN = "ps"
MAX_ROUTING_ID_BYTES = 255
# libzmq applies MAXMSGSIZE to a frame as it arrives, before CURVE decrypts it: the
# MESSAGE command wraps each frame in its name, flags, nonce and MAC (33 bytes), so a
# chunk of exactly CHUNK_BYTES would otherwise disconnect its sender (a shard of 1M+
# values could never be pushed or pulled with keys). Rounded up generously.
CURVE_FRAME_OVERHEAD = 256
INBOUND_FRAME_LIMIT = MAX_FRAME_BYTES + CURVE_FRAME_OVERHEAD

Peer = tuple[bytes, ...]
"""A peer as a node sees it: its routing envelope, hashable."""


@dataclass
class Incoming:
    """One received message: its envelope and either the message or why it is unusable."""

    envelope: list[Any]
    message: Message | None
    error: ProtocolError | None
    frames: list[Any]
    size: int
    identity: Identity | None = None  # the CURVE key that sent it (None: no keys in use)

    @cached_property
    def peer(self) -> Peer:
        return tuple(bytes(f) for f in self.envelope)


def largest_message(shard_size: int) -> int:
    """Bytes of the largest legal message for a shard: header, values, envelope."""
    return MAX_HEADER_BYTES + 4 * shard_size + MAX_ENVELOPE_DEPTH * (MAX_ROUTING_ID_BYTES + 1)


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


def bind_router(ctx: zmq.Context, endpoint: str,
                curve: CurveServer | None = None) -> tuple[zmq.Socket, str]:
    """A configured ROUTER bound to ``endpoint``, and the endpoint it got (``tcp://h:*``);
    a CURVE server admitting ``curve.clients`` when ``curve`` is given."""
    sock = configure(ctx.socket(zmq.ROUTER))
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    if curve is not None:
        _admit(ctx, curve.clients)
        sock.curve_secretkey = curve.secret
        sock.curve_publickey = curve.public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN.encode()
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(f"cannot bind {endpoint}: {exc}") from exc
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_dealer(ctx: zmq.Context, endpoint: str, linger_ms: int = LINGER_MS,
                   curve: CurveClient | None = None) -> zmq.Socket:
    """A configured DEALER connected to ``endpoint`` (a CURVE client with ``curve``)."""
    sock = configure(ctx.socket(zmq.DEALER), linger_ms)
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

    A message of more than ``max_bytes`` is read to its end but not kept (only its
    envelope, to answer). ``authenticated``: the socket is a CURVE server, whose
    messages carry the identity of the key that sent them.
    """
    frames: list[Any] = []
    size = 0
    too_large = False
    while True:
        frame = sock.recv(copy=False)
        size += len(frame)
        if max_bytes is not None and size > max_bytes and not too_large:
            too_large = True
            frames = _envelope_part(frames)
        if not too_large:
            frames.append(frame)
        if not frame.more:
            break
    identity = Identity.parse(frames[0].get("User-Id")) if authenticated and frames else None
    if too_large:
        error = ProtocolError(f"message of more than {max_bytes} bytes, larger than any "
                              f"legal message here", ErrorCode.TOO_LARGE)
        return Incoming(frames, None, error, frames, size, identity)
    try:
        envelope, body = split_envelope(frames)
    except ProtocolError as exc:
        # without a delimiter the reply route is unknown: the first frame is the
        # peer's identity on a ROUTER, so answer there if there is one
        return Incoming(list(frames[:1]), None, exc, list(frames), size, identity)
    if len(envelope) > MAX_ENVELOPE_DEPTH or any(len(f) > MAX_ROUTING_ID_BYTES
                                                 for f in envelope):
        error = ProtocolError(f"routing envelope of {len(envelope)} frames (at most "
                              f"{MAX_ENVELOPE_DEPTH} of {MAX_ROUTING_ID_BYTES} bytes)")
        return Incoming(envelope[:1], None, error, list(frames), size, identity)
    try:
        return Incoming(envelope, decode(body), None, list(frames), size, identity)
    except ProtocolError as exc:
        return Incoming(envelope, None, exc, list(frames), size, identity)


def _envelope_part(frames: list[Any]) -> list[Any]:
    """The routing envelope of a message's first frames (or its first frame)."""
    for i, f in enumerate(frames):
        if len(f) == 0:
            return frames[: min(i, MAX_ENVELOPE_DEPTH)]
    return frames[:1]


def send(sock: zmq.Socket, envelope: Sequence[Any], header: Header,
         tensor: np.ndarray | None = None) -> None:
    """Send ``header`` (and its tensor) behind ``envelope``."""
    send_frames(sock, join_envelope(envelope, encode(header, tensor)))


_MORE = int(zmq.SNDMORE)


def send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0) -> None:
    """Send frames as one message (as ``send_multipart(copy=False)``, without its
    per-frame type checks and flag enums: this runs for every message of a round)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, flags | _MORE if i < last else flags, copy=False)


class _KeyAuthenticator:
    """The ZAP handler of a context: admits the run's client keys, names them."""

    def __init__(self, ctx: zmq.Context) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        clients: dict[bytes, Identity] = {}
        self.clients = clients

        class Named(ThreadAuthenticator):
            def curve_user_id(self, client_public_key: bytes) -> str:
                return clients[z85.encode(client_public_key)].name

        class Provider:
            @staticmethod
            def callback(domain: str, key: bytes) -> bool:
                return key in clients

        self.thread = Named(ctx)
        self.thread.start()
        self.thread.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=Provider())


_authenticators: dict[int, _KeyAuthenticator] = {}


def _admit(ctx: zmq.Context, clients: dict[bytes, Identity]) -> None:
    """Start ``ctx``'s ZAP handler if needed and admit ``clients`` to it."""
    auth = _authenticators.get(id(ctx))
    if auth is None:
        auth = _authenticators[id(ctx)] = _KeyAuthenticator(ctx)
    auth.clients.update(clients)


def shut_down(ctx: zmq.Context, linger_ms: int = LINGER_MS) -> None:
    """Stop ``ctx``'s ZAP handler, close its sockets and terminate it, so that what is
    still queued for a peer (the last round's replies) goes out within ``linger_ms``
    instead of dying with the process (``os._exit`` or a quick interpreter exit would
    drop it)."""
    auth = _authenticators.pop(id(ctx), None)
    if auth is not None:
        auth.thread.stop()
    ctx.destroy(linger=linger_ms)
