"""Client side of the protocol: one DEALER per server process (or per proxy standing in
for one).

Requests to the servers go out together and their replies are gathered with one
poller. What to send, when to resend, replay or catch up, and when to give up is
decided by the socket-free ``ClientCore`` (``worker/core.py``, where the retry,
replay, catch-up and handshake rules are described); this module holds the sockets
and the loop that feeds the core:

* a ``Link`` is a DEALER to one endpoint that can be thrown away and reopened (a
  reopened socket is a new peer to the server: the core has it say HELLO first), with
  a socket monitor whose events (handshake succeeded or failed, disconnected) go to
  the core;
* a ``ClusterClient`` is one worker's (or the evaluator's) core and links;
  ``poll_clients`` polls the links that still owe an answer of several clients at once
  (the workers of one process), in slices of ``WAIT_SLICE_MS`` so a stop request is
  seen, and hands each client's core its replies, its monitors' events when none of
  its links had one, and the time; ``exchange_all`` runs one exchange of each client
  to its outcome that way (a worker process's workers say HELLO and catch up
  together; ``worker/run.py`` drives their rounds).

With keys each link is a CURVE client that checks the server's key.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable, Collection, Sequence

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from common.errors import ConfigError
from common.net.keys import CurveClient, KeyRing
from common.net.protocol import (
    ITEM_BYTES,
    MAX_HEADER_BYTES,
    Buffer,
    Message,
    ProtocolError,
    Welcome,
)
from common.net.sharding import ServerSlices, ShardSet
from common.net.transport import (
    CURVE_FRAME_OVERHEAD,
    connect_dealer,
    largest_message,
    receive,
    send_frames,
)
from common.run.buffers import HostBuffers
from common.run.config import RunConfig
from common.run.process import check_stop
from worker.core import ClientCore, Connection, RetryPolicy, Send

log = logging.getLogger("ps.client")

# Replies are awaited in slices of at most this long, so a stop request is seen.
WAIT_SLICE_MS = 250
NOBLOCK = int(zmq.NOBLOCK)
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
# The server refused this key, or the handshake broke its protocol: final at once.
HANDSHAKE_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


def _connection(event: int) -> Connection:
    """A socket monitor's event as the core reads it."""
    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return Connection.SUCCEEDED
    if event == zmq.EVENT_DISCONNECTED:
        return Connection.DISCONNECTED
    if event & HANDSHAKE_REFUSED:
        return Connection.REFUSED
    return Connection.CLOSED


class Link:
    """A DEALER socket to one endpoint, and its monitor, that can be reopened.

    ``length``: the values of the server process's shards, when known: no reply is then
    larger than a PARAMS of them (``largest_message``), and no frame larger than its
    values or a header, so a larger one disconnects the peer (ZeroMQ's MAXMSGSIZE) or is
    read and dropped (:func:`common.net.transport.receive`): a Byzantine server or proxy
    cannot make a worker hold more."""

    def __init__(self, ctx: zmq.Context, endpoint: str, curve: CurveClient | None,
                 length: int | None = None) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.curve = curve
        self.max_bytes = None if length is None else largest_message(length)
        self.max_frame = (None if length is None
                          else max(MAX_HEADER_BYTES, ITEM_BYTES * length) + CURVE_FRAME_OVERHEAD)
        self.socket, self.monitor = self._open()

    def _open(self) -> tuple[zmq.Socket, zmq.Socket]:
        sock = connect_dealer(self.ctx, self.endpoint, linger_ms=0, curve=self.curve,
                              max_frame=self.max_frame)
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
        if self.curve is not None:
            events |= HANDSHAKE_FAILED
        return sock, sock.get_monitor_socket(events)

    def reopen(self) -> None:
        """A new socket (what was queued on the old one is dropped); if it cannot be
        opened, the old one stays, to be closed with the link."""
        socket, monitor = self._open()
        self.close()
        self.socket, self.monitor = socket, monitor

    def send(self, frames: list[Buffer]) -> bool:
        """Send without blocking; False if there is no live connection to send on (e.g.
        after a refused handshake; a DEALER would block)."""
        try:
            send_frames(self.socket, [b"", *frames], NOBLOCK)
        except zmq.Again:
            return False
        return True

    def receive(self) -> Message | ProtocolError:
        """The next reply, or why it is malformed."""
        incoming = receive(self.socket, self.max_bytes)
        if incoming.message is None:
            return incoming.error or ProtocolError("undecodable reply")
        if incoming.envelope:
            return ProtocolError("reply with a routing envelope before the delimiter")
        return incoming.message

    def events(self) -> list[Connection]:
        """What the socket's monitor saw since the last call."""
        out = []
        while self.monitor.poll(0):
            out.append(_connection(recv_monitor_message(self.monitor)["event"]))
        return out

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)


def relay_keys(keys: KeyRing | None, role: str, worker: int, via_proxy: Collection[int],
               ) -> Callable[[int], bytes | None] | None:
    """What a worker tags its messages to server process s with: the key it shares with
    that server end to end where a proxy relays them (``via_proxy``), else nothing (its
    own CURVE connection says who speaks); None without keys or for the evaluator."""
    if keys is None or role != "worker":
        return None
    ring = keys
    return lambda server: (ring.worker_relay_key(worker, server) if server in via_proxy
                           else None)


class ClusterClient:
    """Talks to the server processes of one run on behalf of a worker or evaluator:
    ``servers`` as ``ClientCore`` takes them (each link's key is its process's,
    ``server-<first shard>``, or for those in ``via_proxy`` the key of the ps-proxy in
    front of it, ``proxy-<first shard>``; a worker tags what it says end to end for the
    server either way). ``d``: the model's size, where known: each link takes no reply
    larger than its shards' values, and a WELCOME of another size is a ``ConfigError``."""

    def __init__(
        self,
        servers: list[str] | list[tuple[ShardSet, str]],
        cfg: RunConfig,
        role: str,
        worker: int,
        policy: RetryPolicy | None = None,
        keys: KeyRing | None = None,
        replay_rounds: int = 0,
        vectors: HostBuffers | None = None,
        via_proxy: Collection[int] = (),
        d: int | None = None,
    ) -> None:
        self.core = ClientCore(cfg, role, worker, servers, policy, replay_rounds, vectors,
                               relay_keys(keys, role, worker, via_proxy))
        self.role = role
        self.expected_d = d
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        name = f"worker-{worker}" if role == "worker" else role
        self.links = [Link(self.ctx, link.endpoint,
                           keys.client_curve(name, link.shards[0],
                                             via_proxy=link.shards[0] in via_proxy)
                           if keys else None,
                           None if d is None
                           else ServerSlices.of(d, cfg.num_shards, link.shards).length)
                      for link in self.core.links]

    @property
    def d(self) -> int:
        return self.core.d

    def close(self) -> None:
        for link in self.links:
            link.close()

    # -- operations (see ``ClientCore``) ------------------------------------------

    def hello(self) -> list[Welcome]:
        """Handshake with every shard; learn the shard ranges and d."""
        welcomes = self._exchange(self.core.hello)
        if not isinstance(welcomes, list):
            raise TypeError(f"a HELLO exchange ended with {type(welcomes).__name__}")
        if self.expected_d is not None and self.core.d != self.expected_d:
            raise ConfigError(f"servers hold d={self.core.d} parameters, this "
                              f"{self.role}'s model has {self.expected_d}")
        return welcomes

    def pull(self, round_: int) -> np.ndarray:
        """The full parameter vector x^round_, assembled from every shard's PARAMS."""
        x = self._exchange(lambda now: self.core.pull(round_, now))
        if not isinstance(x, np.ndarray):
            raise TypeError(f"a PULL exchange ended with {type(x).__name__}")
        return x

    # -- the loop ----------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """An exchange is under way (its outcome is ``core.outcome`` once it is not)."""
        return bool(self.core.pending)

    def begin(self, start: Callable[[float], list[Send]]) -> None:
        """Start an exchange of the core (``start(now)``: what to send); what it raises is
        raised, after the exchange is abandoned."""
        core = self.core
        try:
            for s in range(len(self.links)):  # a refused or failing handshake ends it now
                core.connection(s, self.links[s].events(), time.monotonic())
            self._apply(start(time.monotonic()))
        except Exception:
            self._apply(core.abandon())
            raise

    def _exchange(self, start: Callable[[float], list[Send]]) -> object:
        """Run one exchange of the core to its outcome (what it raises, raised)."""
        return exchange_all([(self, start)])[0]

    def _take(self, ready: dict[zmq.Socket, int], now: float) -> None:
        """Hand the core the replies among ``ready``, or its monitors' events if none of
        its links had one; then the time.

        A reply that came after the poll but before its connection closed (a server
        that answers and exits) is read before the event is handed on: dropped with a
        request in flight, the link would be reopened and that reply lost."""
        core = self.core
        readable = {self.links[s].socket for s in core.pending} & ready.keys()
        if not readable:
            for s in sorted(core.pending):
                link = self.links[s]
                events = link.events()
                if events and link.socket.poll(0):  # ZeroMQ queued it before the event
                    readable.add(link.socket)
                core.connection(s, events, now)
        for s, link in enumerate(self.links):
            # (a reply may have reopened another shard's link: its old socket is gone)
            if link.socket in readable and s in core.pending:
                self._apply(core.handle(s, link.receive(), now))
        self._apply(core.tick(now))

    def _apply(self, sends: list[Send]) -> None:
        for send in sends:
            link = self.links[send.link]
            if send.reopen:
                link.reopen()
            if not link.send(send.frames):
                # no connection: a failed handshake ends the client now; else the
                # request is left to the timeout and resend
                self.core.connection(send.link, link.events(), time.monotonic())
                log.debug("%s: no connection to send on yet; the timeout will resend",
                          link.endpoint)


def reserve_links(links: int) -> None:
    """Room in this process for ``links`` links (a DEALER and its monitor each, and their
    file descriptors), before the first is opened: ZeroMQ's socket cap (1023 by default)
    and the open-file limit are raised as needed; ``ConfigError`` if the hard limit is too
    low (a process of many workers and server processes: 100 x 20 links)."""
    sockets = 4 * links + 64  # a DEALER, its monitor, the monitor's peer; and reopening
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    if ctx.get(zmq.MAX_SOCKETS) < sockets:
        ctx.set(zmq.MAX_SOCKETS, sockets)
    files = 4 * links + 256  # the connection, each socket's mailbox, the library's own
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < files:
        if hard != resource.RLIM_INFINITY and hard < files:
            raise ConfigError(f"{links} connections need about {files} open files, and this "
                              f"process may open {hard} (ulimit -n): run the workers in more "
                              f"processes (--worker-processes)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, hard))


def poll_clients(clients: Sequence[ClusterClient]) -> None:
    """Wait for replies to the exchanges under way of ``clients`` (the workers of one
    process: one poll over all their links), at most until the earliest timeout or
    ``WAIT_SLICE_MS``, and hand each client's core what came. What a core raises is
    raised, after that client's exchange is abandoned."""
    busy = [c for c in clients if c.busy]
    if not busy:
        return
    poller = zmq.Poller()
    for client in busy:
        for s in client.core.pending:
            poller.register(client.links[s].socket, zmq.POLLIN)
    deadline = min((d for d in (c.core.next_deadline() for c in busy) if d is not None),
                   default=None)
    wait_ms = WAIT_SLICE_MS if deadline is None else int((deadline - time.monotonic()) * 1000)
    ready = dict(poller.poll(max(0, min(wait_ms, WAIT_SLICE_MS))))
    now = time.monotonic()
    for client in busy:
        try:
            client._take(ready, now)
        except Exception:
            client._apply(client.core.abandon())
            raise


def exchange_all(starts: Sequence[tuple[ClusterClient, Callable[[float], list[Send]]]],
                 ) -> list[object]:
    """Run one exchange of each client at once (``start(now)`` each) to their outcomes,
    in order: the workers of one process say HELLO and catch up together, so none waits
    for a round that needs another's push."""
    clients = [client for client, _ in starts]
    for client, start in starts:
        client.begin(start)
    try:
        while any(c.busy for c in clients):
            check_stop()
            poll_clients(clients)
    except BaseException:  # a stop request, or a peer's error: no reply read as the next's
        for client in clients:
            client._apply(client.core.abandon())
        raise
    return [c.core.outcome for c in clients]
