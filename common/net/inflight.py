"""Bounds what one TCP connection can make a ROUTER hold before a message is delivered.

libzmq bounds a frame (``MAXMSGSIZE``) but not a message: it delivers a multipart
message only once all its frames are in, so a peer that sends a message of many legal
frames makes the node hold all of them (a key holder could have a server OOM-killed
with one 2 GB message of 4 MiB frames). libzmq has no option against that, so this
guard watches each accepted connection from outside:

* it learns each connection's file descriptor from the socket's monitor
  (``EVENT_ACCEPTED``) and knows the connection by its socket's inode; the node reports
  every delivered message's exact cost on the wire (:func:`wire_bytes` of each frame),
  source descriptor (``zmq.SRCFD``) and key (``User-Id``) with
  :meth:`InflightGuard.delivered`;
* a connection is attributed to the key of its first delivered message, provided the
  connection has received that many bytes (else the message was left over from a
  closed connection whose descriptor this one reuses); a connection later naming
  another key is ambiguous and never attributed again;
* every ``interval_s`` it reads each connection's bytes received (Linux ``TCP_INFO``
  ``tcpi_bytes_received``) less those still in the kernel's queue (``FIONREAD``): what
  libzmq has read from it. Less what was delivered, that is what the node holds for the
  connection: complete messages queued in its pipe (at most ``RCVHWM``) and the one
  being received;
* a connection holding more than its limit (``limit``; ``first_limit`` before it has
  delivered anything) is cut (``shutdown``: libzmq drops the partial message and frees
  it) and reported to ``on_offence`` with its key, so the node bars that key (None when
  no message named it: cut, nothing to bar);
* a connection that delivered nothing for ``idle_cut_s`` is cut (honest clients say
  HELLO at once; the admission counts such a connection only that long), and one that
  would give its key more than ``max_connections`` attributed connections is cut when
  its first message names the key;
* *bare* connections, which have delivered nothing yet (no key is known before the
  CURVE handshake, so the admission's budgets cannot apply), are bounded by source
  address (``MAX_BARE_PER_SOURCE`` and two per client the node expects: a new one
  beyond is cut at once) and in all (``MAX_BARE`` and four per client: the oldest is
  cut): a flood of connections that never start a handshake costs the guard a bounded
  scan and crowds out no one for long (an honest client's connection delivers its HELLO
  within milliseconds).

The guard runs in a thread of its own and costs about 4 µs per connection and scan.
Without ``TCP_INFO`` (another OS, or an ``ipc://`` endpoint) it only keeps the count of
connections per key and says so in the log: messages in flight are then bounded by the
process's memory limit alone.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from common.net.admission import PENDING_S
from common.net.budgets import LogThrottle
from common.net.keys import Identity

log = logging.getLogger("ps.transport")

INTERVAL_S = 0.005  # a 500 MB message arrives in ~0.2 s on loopback: react within a few MB
IDLE_CUT_S = PENDING_S  # the admission counts a connection no message named this long
# A CURVE frame travels as a MESSAGE command: its name (1 + 7 bytes), short nonce (8),
# MAC (16) and flags (1) around the payload (libzmq 4.x, ZMTP 3).
CURVE_MESSAGE_OVERHEAD = 33
# The greeting and the security handshake before any message: at most (what the held
# bytes are allowed) and at least (what a connection must have received besides its
# messages for one to be attributed to it). A CURVE handshake is 550-600 bytes: the
# greeting (64), HELLO (202) and INITIATE (250 and the metadata).
HANDSHAKE_BYTES = 8192
CURVE_HANDSHAKE_MIN = 512
# What libzmq reads ahead of the message it decodes (its input batch) and the frame
# being decoded.
READ_AHEAD_BYTES = 64 * 1024
# Connections that have delivered nothing yet: at most this many from one source address
# (a new one beyond is cut), and in all (the oldest is cut); more where a node expects
# more honest clients at once (bare_bounds).
MAX_BARE_PER_SOURCE = 64
MAX_BARE = 512
_TCP_INFO_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received in struct tcp_info (Linux)
_TCP_INFO_LENGTH = _TCP_INFO_BYTES_RECEIVED + 8


def wire_bytes(payload: int, curve: bool) -> int:
    """Bytes a frame of ``payload`` bytes took on the wire: a ZMTP frame header (flags and
    a 1-byte size, or an 8-byte one past 255) around the payload or, with CURVE, around
    the MESSAGE command that carries it. Exact, so that no peer can gain slack by
    sending many small frames."""
    body = payload + CURVE_MESSAGE_OVERHEAD if curve else payload
    return body + (2 if body <= 255 else 9)


def hold_limit(largest_message: int, queued_messages: int, largest_frame: int) -> int:
    """Bytes one connection may make the node hold: ``queued_messages`` complete legal
    messages waiting in its pipe, the one being received, the frame being decoded and
    libzmq's read-ahead."""
    return (queued_messages + 1) * largest_message + largest_frame + READ_AHEAD_BYTES


def tcp_info_available(endpoint: str) -> bool:
    """TCP_INFO with ``tcpi_bytes_received`` (Linux 4.1+) serves ``endpoint``."""
    if not endpoint.startswith("tcp://"):
        return False
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        info = probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LENGTH)
        return len(info) >= _TCP_INFO_LENGTH
    except (OSError, AttributeError):
        return False
    finally:
        probe.close()


def bare_bounds(clients: int) -> tuple[int, int]:
    """(per source address, in all): the bounds on connections that have delivered
    nothing, with room for ``clients`` honest ones starting at once, all from one host
    (a local cluster) and twice over (each may reconnect while its old one lingers)."""
    return MAX_BARE_PER_SOURCE + 2 * clients, MAX_BARE + 4 * clients


@dataclass
class _Connection:
    fd: int
    accepted: float
    source: str = ""  # the peer's address (for bare connections: their bound)
    identity: Identity | None = None
    ambiguous: bool = False  # its messages named two keys: never attributed
    delivered: int = 0  # wire bytes of the messages delivered to the node
    cut: bool = False


Offence = Callable[[Identity | None, str], None]


class InflightGuard:
    """Watches the connections of one bound ROUTER (see the module docstring)."""

    def __init__(self, sock: zmq.Socket, *, limit: int, first_limit: int, curve: bool,
                 tcp_info: bool, on_offence: Offence, max_connections: int | None = None,
                 on_named: Callable[[Identity, float], None] | None = None,
                 interval_s: float = INTERVAL_S, idle_cut_s: float = IDLE_CUT_S,
                 bare: tuple[int, int] | None = None) -> None:
        self.limit = limit
        self.first_limit = first_limit
        self.handshake_min = CURVE_HANDSHAKE_MIN if curve else 0
        self.tcp_info = tcp_info
        self.on_offence = on_offence
        self.max_connections = max_connections
        # a connection attributed to a key, and how long ago it was accepted
        # (Admission.named)
        self.on_named = on_named
        self.interval_s = interval_s
        self.idle_cut_s = idle_cut_s
        self.cuts = 0
        self.bare_cuts = 0
        self.max_bare_per_source, self.max_bare = bare or bare_bounds(0)
        self._connections: dict[int, _Connection] = {}  # by socket inode
        # the bare connections (guard thread only): by source, and all of them oldest first
        self._bare_by_source: dict[str, set[int]] = {}
        self._bare: dict[int, None] = {}
        self._stop = threading.Event()
        self._throttle = LogThrottle()
        self._monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED)
        self._sock = sock
        if not tcp_info:
            log.warning("no TCP_INFO for %s: a message in flight is bounded only by the "
                        "process's memory limit", sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self._thread = threading.Thread(target=self._run, name="inflight-guard", daemon=True)
        self._thread.start()

    # -- called by the node's loop (and the ZAP handler) ---------------------------

    def delivered(self, fd: int, identity: Identity | None, wire: int) -> None:
        """A message that took ``wire`` bytes on the wire came from descriptor ``fd``."""
        inode = _inode(fd)
        if inode < 0:  # closed already
            return
        conn = self._connections.get(inode)
        if conn is None:  # delivered before the guard saw the connection accepted
            conn = self._connections.setdefault(inode, _Connection(fd, time.monotonic()))
        if identity is not None and not conn.ambiguous and conn.identity != identity:
            if conn.identity is not None:
                conn.identity, conn.ambiguous = None, True
            elif self.tcp_info and _bytes_read(fd) < (conn.delivered + wire
                                                       + self.handshake_min):
                return  # left over from a closed connection on the same descriptor
            elif (self.max_connections is not None
                  and self.connections(identity) >= self.max_connections):
                self._cut(inode, conn)
                self.on_offence(None, f"{identity.name} already holds "
                                f"{self.max_connections} connections")
                return
            else:
                conn.identity = identity
                if self.on_named is not None:
                    self.on_named(identity, time.monotonic() - conn.accepted)
        conn.delivered += wire

    def connections(self, identity: Identity) -> int:
        """Attributed connections of ``identity`` open now (``Admission.live``)."""
        return sum(c.identity == identity and not c.cut
                   for c in list(self._connections.values()))

    def cut_all(self, identity: Identity) -> int:
        """Cut every connection of ``identity`` (a barred key); how many."""
        return sum(self._cut(inode, conn) for inode, conn in list(self._connections.items())
                   if conn.identity == identity and not conn.cut)

    def close(self) -> None:
        """Stop the thread (before the socket closes)."""
        self._stop.set()
        self._thread.join()
        self._sock.disable_monitor()
        self._monitor.close(linger=0)

    # -- the thread ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._monitor.poll(int(self.interval_s * 1000)):
                    self._accepted()
                self._scan(time.monotonic())
            except Exception:  # never end the guard: log (at most every 10 s), go on
                if self._throttle.admit("scan", time.monotonic()) is not None:
                    log.exception("the in-flight guard's scan failed; going on")

    def _accepted(self) -> None:
        while self._monitor.poll(0):
            fd = int(recv_monitor_message(self._monitor)["value"])
            inode = _inode(fd)
            if inode >= 0:
                conn = self._connections.setdefault(
                    inode, _Connection(fd, time.monotonic(), _source(fd)))
                if not conn.delivered:
                    self._bound_bare(inode, conn)

    def _bound_bare(self, inode: int, conn: _Connection) -> None:
        """A new connection that has delivered nothing: cut it if its source holds
        ``max_bare_per_source`` such already, else count it and cut the oldest beyond
        ``max_bare``."""
        same = self._bare_by_source.setdefault(conn.source, set())
        if len(same) >= self.max_bare_per_source:
            self._cut_bare(inode, conn, f"{conn.source} holds {self.max_bare_per_source} "
                           "connections that have not completed a handshake")
            return
        same.add(inode)
        self._bare[inode] = None
        while len(self._bare) > self.max_bare:
            oldest = next(iter(self._bare))
            old = self._connections.get(oldest)
            self._forget_bare(oldest, old)
            if old is not None and not old.delivered:
                self._cut_bare(oldest, old, f"more than {self.max_bare} connections have "
                               "not completed a handshake; cut the oldest")

    def _cut_bare(self, inode: int, conn: _Connection, why: str) -> None:
        if self._cut(inode, conn):  # counted by the node (and logged within its throttle)
            self.bare_cuts += 1
            self.on_offence(None, why)

    def _forget_bare(self, inode: int, conn: _Connection | None) -> None:
        self._bare.pop(inode, None)
        if conn is not None:
            same = self._bare_by_source.get(conn.source)
            if same is not None:
                same.discard(inode)
                if not same:
                    del self._bare_by_source[conn.source]

    def _scan(self, now: float) -> None:
        for inode, conn in list(self._connections.items()):
            if inode in self._bare and (conn.delivered or conn.cut
                                        or _inode(conn.fd) != inode):
                self._forget_bare(inode, conn)
            if _inode(conn.fd) != inode:  # closed (and its descriptor maybe reused)
                self._connections.pop(inode, None)
                continue
            if conn.cut:
                continue
            if self.tcp_info:
                limit = self.limit if conn.delivered else self.first_limit
                held = _bytes_read(conn.fd) - HANDSHAKE_BYTES - conn.delivered
                if held > limit:
                    held -= _queued(conn.fd)  # still in the kernel: not the node's memory
                if held > limit:
                    if self._cut(inode, conn):
                        self.on_offence(conn.identity, f"held {held:,} bytes of a message "
                                        f"not yet complete (limit {limit:,})")
                    continue
            if not conn.delivered and now - conn.accepted > self.idle_cut_s:
                self._cut(inode, conn)

    def _cut(self, inode: int, conn: _Connection) -> int:
        """Shut the connection down (libzmq then closes it); 0 if its descriptor is
        another file by now. Through a duplicate of the descriptor checked to be the
        same socket, so no descriptor reused meanwhile is ever shut down."""
        try:
            duplicate = os.dup(conn.fd)
        except OSError:
            self._connections.pop(inode, None)
            return 0
        try:
            if os.fstat(duplicate).st_ino != inode:
                self._connections.pop(inode, None)
                return 0
            with socket.socket(fileno=duplicate) as sock:
                duplicate = -1  # the socket object closes it
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed meanwhile: nothing left to cut
        finally:
            if duplicate >= 0:
                os.close(duplicate)
        conn.cut = True
        self.cuts += 1
        return 1


def _inode(fd: int) -> int:
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return -1


def _bytes_read(fd: int) -> int:
    """Bytes the connection on ``fd`` has received (0 if it is gone or no TCP socket)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LENGTH)
    except OSError:
        return 0
    finally:
        sock.detach()
    if len(info) < _TCP_INFO_LENGTH:
        return 0
    return struct.unpack_from("=Q", info, _TCP_INFO_BYTES_RECEIVED)[0]


def _source(fd: int) -> str:
    """The address of the peer on ``fd`` ("" if it has none or is gone)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return ""
    try:
        peer = sock.getpeername()
    except OSError:
        return ""
    finally:
        sock.detach()
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


def _queued(fd: int) -> int:
    """Bytes received on ``fd`` that libzmq has not read yet."""
    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return 0
    return struct.unpack("=i", buf)[0]
