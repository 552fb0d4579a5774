"""The bytes of large replies a key may leave untaken (``common.net.transport.ReplyLedger``):
sent without a copy, each keeps its values alive until libzmq has sent it; beyond the
budget they are dropped and reported, and what was taken frees the budget again."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from common.net.protocol import Params
from common.net.transport import ZERO_COPY_MIN_BYTES, ReplyLedger, send_all

BIG = np.zeros(ZERO_COPY_MIN_BYTES // 4 * 2, np.float32)  # 2 MiB: sent without a copy
SMALL = np.zeros(100, np.float32)


@dataclass
class Reply:
    envelope: list[bytes]
    header: Any
    tensor: Any


FILLER = b"filler"


def _pair() -> tuple[zmq.Socket, zmq.Socket]:
    """A ROUTER and a DEALER (``peer``) whose connection stalls until the dealer reads:
    its receive queue holds one message and already holds ``FILLER``, so its libzmq
    stops reading the socket, and with small kernel buffers a 2 MiB reply stays in the
    router's libzmq (its tracker pending) whatever the load. (With room in its queue the
    dealer's I/O thread would take the reply whole at once, unread by the test.)"""
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.copy_threshold = ZERO_COPY_MIN_BYTES
    router.setsockopt(zmq.SNDBUF, 64 << 10)
    dealer.setsockopt(zmq.RCVBUF, 64 << 10)
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.setsockopt(zmq.IDENTITY, b"peer")
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send(b"hi")
    router.recv_multipart()
    router.send_multipart([b"peer", FILLER])
    deadline = time.monotonic() + 5  # the filler in the dealer's queue, unread
    while not dealer.getsockopt(zmq.EVENTS) & zmq.POLLIN:
        assert time.monotonic() < deadline, "the filler never arrived"
        time.sleep(0.001)
    return router, dealer


def test_large_replies_beyond_the_budget_are_dropped_until_taken() -> None:
    router, dealer = _pair()
    dropped: list[object] = []
    ledger = ReplyLedger(lambda envelope: "worker-1", 3 * BIG.nbytes + 1024, dropped.append)
    big = Params(round=0, shards=[0], length=BIG.size)
    small = Params(round=0, shards=[0], length=SMALL.size)
    try:
        # five large replies, not read: three fit the budget; small ones are not counted
        send_all(router, [Reply([b"peer"], big, BIG) for _ in range(5)]
                 + [Reply([b"peer"], small, SMALL) for _ in range(3)], ledger)
        assert dropped == ["worker-1", "worker-1"]
        assert ledger.held("worker-1") == 3 * BIG.nbytes
        received = 0
        while dealer.poll(2000):
            dealer.recv_multipart()
            received += 1
        assert received == 1 + 3 + 3  # the filler, then the replies sent
        deadline = time.monotonic() + 5
        while ledger.held("worker-1") and time.monotonic() < deadline:
            time.sleep(0.01)  # libzmq hands the frames back through pyzmq's gc thread
        assert ledger.held("worker-1") == 0  # taken: the budget is free again
        send_all(router, [Reply([b"peer"], big, BIG)], ledger)
        assert len(dropped) == 2 and dealer.poll(2000)
    finally:
        router.close(0)
        dealer.close(0)


def test_a_peer_without_a_principal_is_not_counted() -> None:
    router, dealer = _pair()
    ledger = ReplyLedger(lambda envelope: None, 1, lambda principal: None)
    try:
        send_all(router, [Reply([b"peer"], Params(round=0, shards=[0], length=BIG.size), BIG)],
                 ledger)
        assert dealer.recv_multipart() == [FILLER]
        assert dealer.poll(2000) and len(dealer.recv_multipart()[-1]) == BIG.nbytes
    finally:
        router.close(0)
        dealer.close(0)


def test_a_received_frame_relayed_is_counted_by_its_memory() -> None:
    """A proxy relays the server's frames as received (no copy): counted all the same."""
    router, dealer = _pair()
    source, sink = _pair()
    held: list[object] = []
    ledger = ReplyLedger(lambda envelope: bytes(envelope[0]), BIG.nbytes + 1024, held.append)
    try:
        sink.send_multipart([b"", memoryview(BIG)], copy=False)
        frames = source.recv_multipart(copy=False)  # [routing id, delimiter, values]
        values = frames[2]
        assert isinstance(values, zmq.Frame) and len(values) == BIG.nbytes
        assert ledger.send(router, [b"peer"], [b"header", values], BIG.nbytes)
        time.sleep(0.2)  # time enough to send it all, were the connection not stalled
        assert ledger.held(b"peer") == BIG.nbytes
        assert not ledger.send(router, [b"peer"], [b"header", values], BIG.nbytes)
        assert held == [b"peer"] and ledger.held(b"peer") == BIG.nbytes
        assert dealer.recv_multipart() == [FILLER]
        assert dealer.poll(2000) and len(dealer.recv_multipart()[-1]) == BIG.nbytes
    finally:
        for sock in (router, dealer, source, sink):
            sock.close(0)
