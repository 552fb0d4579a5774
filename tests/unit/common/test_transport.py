"""Replies through a node's ROUTER (``common.net.transport.Listener.send_all``), with real
ZeroMQ sockets on the loopback: those sharing one message are encoded and copied once
and arrive bit-identical at every peer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import zmq

import common.net.transport as transport
from common.net.protocol import CHUNK_BYTES, Ack, Header, Params, Status, encode
from common.net.transport import Listener, connect_dealer, largest_message, send_frames, shut_down
from server.core import Reply

TIMEOUT_MS = 5000


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    shut_down(context, linger_ms=0)


def connected(ctx: zmq.Context, listener: Listener,
              count: int) -> tuple[list[zmq.Socket], list[list[Any]]]:
    """``count`` DEALERs that sent the listener a message, and their envelopes there."""
    dealers, envelopes = [], []
    for _ in range(count):
        dealer = connect_dealer(ctx, listener.endpoint, 0)
        dealer.send_multipart([b"", *encode(Status())])
        assert listener.sock.poll(TIMEOUT_MS)
        dealers.append(dealer)
        envelopes.append(listener.receive().envelope)
    return dealers, envelopes


def received(dealer: zmq.Socket) -> list[bytes]:
    assert dealer.poll(TIMEOUT_MS)
    return dealer.recv_multipart()


def wire(header: Header, tensor: Sequence[np.ndarray] | None = None) -> list[bytes]:
    """What a DEALER receives for ``header`` (and ``tensor``) sent by :func:`send`."""
    return [b"", *(bytes(f) for f in encode(header, tensor))]


def test_replies_sharing_a_message_are_encoded_and_copied_once(
        ctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    listener = Listener(ctx, "tcp://127.0.0.1:*", None, largest_message(60_000))
    try:
        dealers, envelopes = connected(ctx, listener, 4)
        tensor = [np.arange(40_000, dtype=np.float32), np.full(20_000, 0.5, np.float32)]
        header = Params(round=3, shards=[0, 1], length=60_000)  # 240 KB of values
        ack = Ack(round=3, worker=0)
        expected = wire(header, tensor)
        encoded: list[Header] = []
        sent: list[list[Any]] = []

        def counted_encode(h: Header, t: Any = None) -> list[Any]:
            encoded.append(h)
            return encode(h, t)

        def kept_send_frames(sock: zmq.Socket, frames: list[Any], flags: int = 0) -> None:
            sent.append(frames)
            send_frames(sock, frames, flags)

        monkeypatch.setattr(transport, "encode", counted_encode)
        monkeypatch.setattr(transport, "send_frames", kept_send_frames)
        listener.send_all([*(Reply(e, header, tensor) for e in envelopes),
                           Reply(envelopes[0], ack)])
        for part in tensor:
            part[:] = -1  # in place, once sent: the messages hold their own copy
        assert encoded == [header, ack]
        bodies = [frames[2:] for frames in sent[:4]]  # after the envelope and delimiter
        assert all(f is g for body in bodies[1:] for f, g in zip(body, bodies[0], strict=True))
        assert [bytes(memoryview(f)) for f in sent[0][1:]] == expected
        for dealer in dealers:
            assert received(dealer) == expected
        assert received(dealers[0]) == wire(ack)
    finally:
        listener.close(0)


def test_a_shared_payload_of_several_chunks_arrives_whole_at_every_peer(
        ctx: zmq.Context) -> None:
    length = CHUNK_BYTES // 4 + 1000  # two chunks, the first shared with the array
    listener = Listener(ctx, "tcp://127.0.0.1:*", None, largest_message(length))
    try:
        dealers, envelopes = connected(ctx, listener, 3)
        tensor = [np.random.default_rng(0).standard_normal(length).astype(np.float32)]
        header = Params(round=1, shards=[0], length=length)
        listener.send_all([Reply(e, header, tensor) for e in envelopes])
        expected = wire(header, tensor)
        for dealer in dealers:
            assert received(dealer) == expected
    finally:
        listener.close(0)
