"""A node's listening socket against key holders, with real ZeroMQ sockets in one process:
the in-flight guard, bars, enforced ZAP, no routing-id takeover, a missing User-Id."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from common.net.inflight import _bytes_read
from common.net.keys import Identity, KeyRing, create_keys
from common.net.protocol import ErrorCode, Hello, Status, decode, encode
from common.net.transport import Listener, bind_router, connect_dealer, receive
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

LARGEST = 64 * 1024  # the largest legal message of this node, for the test
STATUS = [b"", *encode(Status())]


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    from common.net.transport import shut_down

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


def test_an_over_long_message_is_cut_before_it_is_held_and_its_key_barred(ctx, ring) -> None:
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0, 2), LARGEST)
    try:
        thief = client(ctx, ring, listener.endpoint)
        thief.send_multipart(STATUS)  # a first message: the connection is attributed
        incoming = next_message(listener)
        assert incoming is not None and incoming.identity == Identity("worker", 0)
        chunk = b"\0" * (1 << 20)
        thief.send_multipart([b"", *[chunk] * 400], copy=False)  # 400 MB, never taken in
        offences = wait_for(listener.offences, 20, "the guard to cut the connection")
        assert offences[0][0] == Identity("worker", 0)
        assert "not yet complete" in offences[0][1]
        assert listener.guard.cuts == 1
        assert next_message(listener, 0.5) is None  # nothing of it was delivered
        # the guard barred the key at once (its next handshake is refused); the node's
        # loop then records it, which changes nothing more
        assert not listener.bar(Identity("worker", 0), offences[0][1])
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
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0, 2), LARGEST)
    try:
        sock = client(ctx, ring, listener.endpoint)
        sock.send_multipart([b"", *[b"\0" * (1 << 20)] * 400], copy=False)
        offences = wait_for(listener.offences, 20, "the guard to cut the connection")
        assert offences == [(None, offences[0][1])]
    finally:
        listener.close(0)


def test_the_node_holds_nothing_of_legal_traffic_after_delivery(ctx, ring) -> None:
    """200 messages of up to the largest legal size (100 x LARGEST in all), sent while
    the node reads them: what the guard counts as held comes back to the handshake's few
    hundred bytes every time, and nothing is cut."""
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0, 2), LARGEST)
    try:
        sock = client(ctx, ring, listener.endpoint)
        held = []
        for i in range(200):
            sock.send_multipart([b"", b"h" * (1 + i % 300), b"\0" * (LARGEST // 2 - 600)])
            assert next_message(listener) is not None
            [conn] = listener.guard._connections.values()
            held.append(_bytes_read(conn.fd) - conn.delivered)
        assert max(held) < 1000 and listener.guard.cuts == 0 and not listener.offences()
    finally:
        listener.close(0)


def test_a_key_holds_at_most_four_connections(ctx, ring) -> None:
    """Eight connections of one key at once: four complete their handshake, the others
    are refused (their handshakes count before any message names them)."""
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0, 2), LARGEST)
    monitors, socks = [], []
    try:
        curve = ring.client_curve("worker-0", 0)
        for _ in range(8):
            sock = ctx.socket(zmq.DEALER)
            socks.append(sock)  # (kept: a socket no longer referenced is closed)
            sock.setsockopt(zmq.LINGER, 0)
            sock.curve_secretkey, sock.curve_publickey = curve.secret, curve.public
            sock.curve_serverkey = curve.server
            monitors.append(sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH))
            sock.connect(listener.endpoint)  # after its monitor: no event missed
        outcomes = []
        for monitor in monitors:
            assert monitor.poll(10_000), "no handshake outcome"
            outcomes.append(recv_monitor_message(monitor)["event"])
        assert outcomes.count(zmq.EVENT_HANDSHAKE_SUCCEEDED) == 4
        assert listener.admission.refused["connections"] == 4
    finally:
        for sock in (*monitors, *socks):
            sock.close(0)
        listener.close(0)


def test_a_worker_reopening_its_socket_again_and_again_is_always_admitted(ctx, ring) -> None:
    """Eight connections of one key one after another within the window, each named by
    a message and then closed (a worker that reopens on every request timeout under
    load): none is refused, since a closed connection no longer counts."""
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0, 2), LARGEST)
    worker = Identity.parse("worker-0")
    try:
        for i in range(8):
            sock = client(ctx, ring, listener.endpoint)
            try:
                sock.send_multipart(STATUS)
                incoming = next_message(listener)
                assert incoming is not None, f"connection {i} got no message through"
                assert incoming.identity == worker
            finally:
                sock.close(0)
            wait_for(lambda: listener.guard.connections(worker) == 0, 5.0,
                     "the closed connection still counted")
        assert listener.admission.refused["connections"] == 0
    finally:
        listener.close(0)


def test_a_message_left_from_a_closed_connection_does_not_name_the_next_one() -> None:
    """SRCFD gives a descriptor number only: a message still queued from a connection that
    closed is reported on the descriptor a new connection got. A connection that has not
    received that many bytes cannot have sent it: it is not attributed to its key."""
    import socket

    from common.net.inflight import InflightGuard

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    server = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(server.getsockname())
    fresh, _ = server.accept()  # a connection that received nothing
    try:
        guard = InflightGuard(router, limit=1 << 20, first_limit=1 << 20, curve=True,
                              tcp_info=True, on_offence=lambda *a: None)
        guard.delivered(fresh.fileno(), Identity("worker", 0), 200)
        assert guard.connections(Identity("worker", 0)) == 0
        peer.sendall(b"\0" * 1000)  # the handshake and a message of its own
        wait_for(lambda: _bytes_read(fresh.fileno()) >= 1000, 5, "the bytes to arrive")
        guard.delivered(fresh.fileno(), Identity("worker", 1), 200)
        assert guard.connections(Identity("worker", 1)) == 1
        guard.delivered(fresh.fileno(), Identity("worker", 0), 100)  # another key: ambiguous
        assert guard.connections(Identity("worker", 1)) == 0
        guard.close()
    finally:
        for s in (peer, fresh, server):
            s.close()
        router.close(0)
        ctx.term()


def test_a_message_of_a_hundred_thousand_empty_frames_is_too_large_and_barred(
        ctx, ring) -> None:
    """Each frame costs the node a message object whatever its size: the frames count in
    what a message may cost (it was 'malformed', cheap to repeat forever)."""
    barred = []
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0, 2), LARGEST)
    try:
        sock = client(ctx, ring, listener.endpoint)
        sock.send_multipart(STATUS)
        assert next_message(listener) is not None
        sock.send_multipart([b"", *[b""] * 100_000])
        incoming = next_message(listener, 30)
        assert incoming.message is None and incoming.error.code is ErrorCode.TOO_LARGE
        assert len(incoming.frames) <= LARGEST // 64
        barred.append(incoming.identity)
        assert barred == [Identity("worker", 0)]
    finally:
        listener.close(0)


def test_without_a_zap_handler_no_key_gets_a_connection(ctx, ring) -> None:
    from common.net import transport

    sock, endpoint = bind_router(ctx, "tcp://127.0.0.1:*", ring.server_curve(0, 2))
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


def _bare(endpoint: str, source: str) -> socket.socket:
    """A TCP connection from ``source`` that never starts a ZMTP or CURVE handshake."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_bare_connections_are_bounded_per_source_and_in_all(ctx, ring, monkeypatch) -> None:
    """Issue 35: connections that never start a handshake (no key is known, so no key's
    budget applies): a source holding MAX_BARE_PER_SOURCE has its next ones cut at once;
    beyond MAX_BARE in all the oldest go; and a keyed client still gets in."""
    import common.net.inflight as inflight

    monkeypatch.setattr(inflight, "MAX_BARE_PER_SOURCE", 5)
    monkeypatch.setattr(inflight, "MAX_BARE", 8)
    listener = Listener(ctx, "tcp://127.0.0.1:*", ring.server_curve(0, 2), LARGEST)
    socks: list[socket.socket] = []
    try:
        first = [_bare(listener.endpoint, "127.0.0.1") for _ in range(5)]
        socks += first
        wait_for(lambda: len(listener.guard._bare) == 5, 10, "five bare connections counted")
        extra = [_bare(listener.endpoint, "127.0.0.1") for _ in range(3)]
        socks += extra
        wait_for(lambda: all(_closed_by_peer(s) for s in extra), 10,
                 "the sixth to eighth connections of one source cut")
        assert not any(_closed_by_peer(s) for s in first)
        others = [_bare(listener.endpoint, "127.0.0.2") for _ in range(5)]
        socks += others
        wait_for(lambda: all(_closed_by_peer(s) for s in first[:2]), 10, "the two oldest cut")
        assert listener.guard.bare_cuts == 5
        assert not any(_closed_by_peer(s) for s in first[2:] + others)
        assert not any(_closed_by_peer(s) for s in others)
        honest = client(ctx, ring, listener.endpoint)
        honest.send_multipart(STATUS)
        assert next_message(listener) is not None  # delivered: never bare for long
        honest.close(0)
    finally:
        for sock in socks:
            sock.close()
        listener.close(0)
