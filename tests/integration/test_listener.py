"""A node's listening socket against key holders, with real ZeroMQ sockets in one process:
the in-flight guard, bars, enforced ZAP, no routing-id takeover, a missing User-Id."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from common.keys import Identity, KeyRing, create_keys
from common.protocol import ErrorCode, Hello, Status, decode, encode
from common.transport import Listener, bind_router, connect_dealer, receive

pytestmark = pytest.mark.integration

LARGEST = 64 * 1024  # the largest legal message of this node, for the test
STATUS = [b"", *encode(Status())]


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    from common.transport import shut_down

    context = zmq.Context()
    yield context
    shut_down(context, linger_ms=0)


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    create_keys(tmp_path / "keys", 1, 2)
    return KeyRing(tmp_path / "keys")


def client(ctx: zmq.Context, ring: KeyRing, endpoint: str, name: str = "worker-0",
           **options: int) -> zmq.Socket:
    sock = connect_dealer(ctx, endpoint, 0, ring.client_curve(name, 0))
    for option, value in options.items():
        sock.setsockopt(getattr(zmq, option), value)
    return sock


def next_message(listener: Listener, timeout_s: float = 5.0):
    return listener.receive() if listener.sock.poll(int(timeout_s * 1000)) else None


def wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")


def test_an_over_long_message_is_cut_before_it_is_held_and_its_key_barred(ctx, ring) -> None:
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0), LARGEST)
    try:
        thief = client(ctx, ring, listener.endpoint)
        thief.send_multipart(STATUS)  # a first message: the connection is attributed
        incoming = next_message(listener)
        assert incoming is not None and incoming.identity == Identity("worker", 0)
        chunk = b"\0" * (1 << 20)
        thief.send_multipart([b"", *[chunk] * 400], copy=False)  # 400 MB, never taken in
        offences = wait_until(listener.offences, 20, "the guard to cut the connection")
        assert offences[0][0] == Identity("worker", 0)
        assert "not yet complete" in offences[0][1]
        assert listener.guard.cuts == 1
        assert next_message(listener, 0.5) is None  # nothing of it was delivered
        assert listener.bar(Identity("worker", 0), offences[0][1])
        # its key gets no connection any more; another key still does
        again = client(ctx, ring, listener.endpoint)
        with contextlib.suppress(zmq.Again):  # no connection to send on: refused
            again.send_multipart(STATUS, flags=zmq.NOBLOCK)
        assert next_message(listener, 1.0) is None
        honest = client(ctx, ring, listener.endpoint, "worker-1")
        honest.send_multipart(STATUS)
        assert next_message(listener).identity == Identity("worker", 1)
        assert listener.admission.refused["barred"] >= 1
    finally:
        listener.close(0)


def test_a_connection_that_starts_with_an_over_long_message_is_cut_unattributed(
        ctx, ring) -> None:
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0), LARGEST)
    try:
        sock = client(ctx, ring, listener.endpoint)
        sock.send_multipart([b"", *[b"\0" * (1 << 20)] * 400], copy=False)
        offences = wait_until(listener.offences, 20, "the guard to cut the connection")
        assert offences == [(None, offences[0][1])]
    finally:
        listener.close(0)


def test_legal_traffic_is_never_cut(ctx, ring) -> None:
    """Messages up to the largest legal size, many queued at once, pass untouched."""
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0), LARGEST)
    try:
        sock = client(ctx, ring, listener.endpoint)
        body = [b"", b"\0" * (LARGEST - 300)]
        for _ in range(50):
            sock.send_multipart(body)
        time.sleep(0.3)  # let them pile up in the pipe and the kernel (nothing read)
        got = 0
        while got < 50 and next_message(listener) is not None:
            got += 1
        assert got == 50 and listener.guard.cuts == 0 and not listener.offences()
    finally:
        listener.close(0)


def test_without_a_zap_handler_no_key_gets_a_connection(ctx, ring) -> None:
    from common import transport

    sock, endpoint = bind_router(ctx, "tcp://127.0.0.1:*", ring.server_curve(0))
    try:
        transport._gate(ctx).thread.stop()  # the handler died
        client(ctx, ring, endpoint).send_multipart(STATUS)
        assert not sock.poll(1000)
    finally:
        sock.close(0)


def test_a_peer_cannot_take_over_another_connections_routing_id(ctx) -> None:
    sock, endpoint = bind_router(ctx, "tcp://127.0.0.1:*")
    try:
        first = _dealer_named(ctx, b"victim")
        first.connect(endpoint)
        first.send_multipart(STATUS)
        assert bytes(receive(sock).envelope[0]) == b"victim"
        thief = _dealer_named(ctx, b"victim")
        thief.connect(endpoint)
        thief.send_multipart(STATUS)
        assert not sock.poll(500)  # the duplicate id's connection is ignored
        sock.send_multipart([b"victim", b"", *encode(Status())])
        assert first.poll(2000) and not thief.poll(200)
    finally:
        sock.close(0)


def _dealer_named(ctx: zmq.Context, routing_id: bytes) -> zmq.Socket:
    """A DEALER (not connected yet) that presents ``routing_id`` to a ROUTER."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def test_a_message_without_a_user_id_is_refused_not_raised(ctx) -> None:
    sock, endpoint = bind_router(ctx, "tcp://127.0.0.1:*")  # no CURVE: no User-Id
    try:
        peer = connect_dealer(ctx, endpoint, 0)
        peer.send_multipart([b"", *encode(Hello(role="worker", worker=0,
                                                config_hash="0" * 16))])
        assert sock.poll(2000)
        incoming = receive(sock, authenticated=True)
        assert incoming.message is None and incoming.error.code is ErrorCode.FORBIDDEN
        assert incoming.envelope  # answerable
        assert decode(encode(Status())).header == Status()
    finally:
        sock.close(0)
