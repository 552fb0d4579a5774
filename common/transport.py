"""The only code that touches ZeroMQ sockets for the server, the proxy and the clients.

* sockets: one configuration for all (inbound frame limit, linger, copy threshold);
  a ROUTER that binds and announces its endpoint in a ready file; a DEALER that
  connects;
* envelopes: a ROUTER sees ``[routing envelope..., b"", header, chunks...]``; the
  envelope (one identity per hop) is opaque and travels back with every reply;
* receive-decode-or-report: :func:`receive` returns an :class:`Incoming` holding either
  the decoded message or the :class:`ProtocolError` that refused it, never raises for
  what a peer sent; the node's core decides what to answer and counts it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from common.errors import ConfigError
from common.protocol import (
    MAX_FRAME_BYTES,
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

    @property
    def peer(self) -> Peer:
        return tuple(bytes(f) for f in self.envelope)


def configure(sock: zmq.Socket, linger_ms: int = LINGER_MS) -> zmq.Socket:
    """Inbound frame limit (a larger frame disconnects the peer), linger, copy threshold."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
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


def bind_router(ctx: zmq.Context, endpoint: str) -> tuple[zmq.Socket, str]:
    """A configured ROUTER bound to ``endpoint``, and the endpoint it got (``tcp://h:*``)."""
    sock = configure(ctx.socket(zmq.ROUTER))
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(f"cannot bind {endpoint}: {exc}") from exc
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_dealer(ctx: zmq.Context, endpoint: str, linger_ms: int = LINGER_MS) -> zmq.Socket:
    """A configured DEALER connected to ``endpoint``."""
    sock = configure(ctx.socket(zmq.DEALER), linger_ms)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(f"cannot connect to {endpoint}: {exc}") from exc
    return sock


def receive(sock: zmq.Socket) -> Incoming:
    """The next message of ``sock``, decoded, or the reason it could not be."""
    frames = sock.recv_multipart(copy=False)
    size = sum(len(f) for f in frames)
    try:
        envelope, body = split_envelope(frames)
    except ProtocolError as exc:
        # without a delimiter the reply route is unknown: the first frame is the
        # peer's identity on a ROUTER, so answer there if there is one
        return Incoming(list(frames[:1]), None, exc, list(frames), size)
    try:
        return Incoming(envelope, decode(body), None, list(frames), size)
    except ProtocolError as exc:
        return Incoming(envelope, None, exc, list(frames), size)


def send(sock: zmq.Socket, envelope: Sequence[Any], header: Header,
         tensor: np.ndarray | None = None) -> None:
    """Send ``header`` (and its tensor) behind ``envelope``."""
    sock.send_multipart(join_envelope(envelope, encode(header, tensor)), copy=False)


def send_frames(sock: zmq.Socket, frames: Sequence[Any]) -> None:
    """Relay frames as they are."""
    sock.send_multipart(frames, copy=False)
