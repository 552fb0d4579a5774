"""Options and small helpers every ZeroMQ socket of the system shares."""

from __future__ import annotations

import os
from pathlib import Path

import zmq

from common.protocol import MAX_FRAME_BYTES

# Frames below this are copied when sent even with copy=False. Zero-copy sends hand
# each frame's release to pyzmq's garbage-collector thread (a thread wake-up and a
# GIL hand-off per frame), which costs more than copying a frame of a few hundred KB;
# it pays off only for large frames.
ZERO_COPY_MIN_BYTES = 1 << 20


def write_ready_file(path: Path | None, endpoint: str) -> None:
    """Announce the endpoint a socket was bound to (atomically: readers never see half)."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(endpoint + "\n", encoding="utf-8")
    os.replace(tmp, path)


def configure(sock: zmq.Socket, linger_ms: int) -> zmq.Socket:
    """Inbound frame limit (a larger frame disconnects the peer), linger, copy threshold."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.copy_threshold = ZERO_COPY_MIN_BYTES
    return sock
