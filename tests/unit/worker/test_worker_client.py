"""Room for a worker process's links: ZeroMQ's socket cap and the open-file limit are
raised before a process of many workers opens its connections (100 workers x 20 server
processes are 2,000 links: past the default cap of 1,023 sockets), and a hard limit too
low for them is a configuration error naming the remedy. And a reply that came just
before its connection closed is read, not lost."""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
import zmq

from common.errors import ConfigError
from common.net.protocol import Params, Pull, Welcome, decode, encode, join_envelope, split_envelope
from common.run.config import RunConfig
from worker import client
from worker.core import Connection, RetryPolicy


def test_the_socket_cap_and_the_open_file_limit_are_raised_for_many_links(
        monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 100_000))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: calls.append(limits))
    client.reserve_links(2000)
    assert zmq.Context.instance().get(zmq.MAX_SOCKETS) >= 3 * 2000
    assert calls == [(4 * 2000 + 256, 100_000)]


def test_enough_room_already_changes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (20_000, 20_000))
    monkeypatch.setattr(resource, "setrlimit", lambda *_: pytest.fail("raised needlessly"))
    client.reserve_links(10)


def test_a_hard_limit_too_low_is_a_configuration_error(monkeypatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 4096))
    with pytest.raises(ConfigError, match=r"2000 connections need about 8256 open files, "
                       r"and this process may open 4096 \(ulimit -n\): run the workers in "
                       r"more processes \(--worker-processes\)"):
        client.reserve_links(2000)


# -- a reply that came just before its connection closed -----------------------------------

CFG = RunConfig(dataset="synthetic", num_workers=2, num_shards=1, rule="mean", q=0,
                rounds=4).validate()


def _answer(server: zmq.Socket, header, tensor=None) -> object:
    """Receive one request at ``server`` (a ROUTER) and answer it; the request's header."""
    assert server.poll(10_000), "no request came"
    envelope, frames = split_envelope(server.recv_multipart())
    server.send_multipart(join_envelope(envelope, encode(header, tensor)))
    return decode(frames).header


def test_a_reply_that_came_before_its_connection_closed_is_read_not_lost() -> None:
    """A server that answers and exits (the last round's ACK): the worker may see the
    monitor's DISCONNECTED when its last poll did not yet show the reply. The reply is
    read first; the request is not taken for lost (reopened and resent, its reply gone)."""
    ctx = zmq.Context.instance()
    server = ctx.socket(zmq.ROUTER)
    server.bind("tcp://127.0.0.1:*")
    endpoint = server.getsockopt_string(zmq.LAST_ENDPOINT)
    c = client.ClusterClient([endpoint], CFG, "worker", 0, RetryPolicy(timeout_s=30))
    try:
        c.begin(c.core.hello)
        _answer(server, Welcome(shards=[0], num_shards=1, d=3, length=3, round=0,
                                rounds=CFG.rounds))
        deadline = time.monotonic() + 10
        while c.busy and time.monotonic() < deadline:
            client.poll_clients([c])
        assert not c.busy
        c.begin(lambda now: c.core.pull(1, now))
        assert isinstance(_answer(server, Params(round=1, shards=[0], length=3),
                                  np.arange(3, dtype=np.float32)), Pull)
        server.close(linger=-1)  # the reply goes out, then the connection closes
        assert c.links[0].monitor.poll(10_000), "the monitor never saw the connection close"
        c._take({}, time.monotonic())  # as after a poll that returned before the reply
        assert not c.busy, "the reply was not read"
        np.testing.assert_array_equal(c.core.outcome, np.arange(3, dtype=np.float32))
    finally:
        c.close()
        server.close(linger=0)


def _server_and_link(length: int) -> tuple[zmq.Socket, client.Link, bytes]:
    """A ROUTER standing in for a (Byzantine) server, a worker's link to it of
    ``length`` values, and the link's routing id as the server sees it."""
    ctx = zmq.Context.instance()
    server = ctx.socket(zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    link = client.Link(ctx, f"tcp://127.0.0.1:{port}", None, length=length)
    assert link.send(encode(Pull(round=0, worker=0)))
    assert server.poll(5000)
    return server, link, server.recv_multipart()[0]


def test_a_reply_larger_than_any_legal_one_is_dropped_not_held() -> None:
    """Issue 35: a worker bounds what a server (or a proxy) can make it hold, from d and
    S: a reply of frames each legal in size but together over a PARAMS of the link's
    values is read and dropped, reported as unusable."""
    server, link, peer = _server_and_link(length=100)
    try:
        header = encode(Params(round=0, shards=[0], length=100), np.zeros(100, np.float32))[0]
        server.send_multipart([peer, b"", header, *([b"\0" * 60_000] * 4)])
        assert link.socket.poll(5000)
        reply = link.receive()
        assert isinstance(reply, client.ProtocolError) and "larger than any legal" in str(reply)
    finally:
        link.close()
        server.close(0)


def test_a_frame_larger_than_the_links_values_disconnects_the_server() -> None:
    server, link, peer = _server_and_link(length=100)
    try:
        assert link.max_frame is not None and link.max_frame < 100_000
        server.send_multipart([peer, b"", b"\0" * 200_000])
        assert not link.socket.poll(1000)  # never delivered: the connection was cut
        assert Connection.DISCONNECTED in link.events()
    finally:
        link.close()
        server.close(0)
