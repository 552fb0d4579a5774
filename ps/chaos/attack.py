"""Phase 2 of the chaos run: every hostile class at each target (a :class:`Lane` of
:class:`Flood` per target, the key of each class as the attackers hold it), the idle TCP
connections held open meanwhile, the strangers (no key or an unknown one) that must get
nothing back, and a node's STATUS (its counters) read with the evaluator's key.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Callable

import zmq

from common.net.keys import CurveClient, KeyRing
from common.net.protocol import Status, StatusReply, decode
from common.net.transport import connect_dealer
from common.run.config import RunConfig
from ps.chaos.classes import Attackers, Target, frames_of, hello_message, hostile_classes
from ps.chaos.floods import Flood, Lane


class Attack:
    """The hostile peers' floods, idle connections and strangers (phase 2)."""

    def __init__(self, cfg: RunConfig, ring: KeyRing, targets: list[Target], quota: int,
                 attackers: Attackers, window_wait_s: float) -> None:
        self.cfg, self.ring, self.targets = cfg, ring, targets
        self.ctx = zmq.Context()
        self.lanes = []
        for target in targets:
            floods = []
            for kind in hostile_classes(cfg):
                # a proxy admits the workers' keys only (the evaluator reads the servers)
                as_worker = kind.key == "worker" or target.name.startswith("proxy")
                worker = attackers.flood if as_worker else -1
                key = f"worker-{worker}" if as_worker else "evaluator"
                floods.append(Flood(target, kind, key, worker, cfg, quota, window_wait_s))
            self.lanes.append(Lane(floods))
        self.idle: list[socket.socket] = []
        self.strangers = {"attempts": 0, "replies": 0}

    @property
    def floods(self) -> list[Flood]:
        return [f for lane in self.lanes for f in lane.floods]

    def hold_idle_connections(self, count: int) -> int:
        """Open ``count`` TCP connections to each target that never say a word."""
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        for target in self.targets:
            host, port = target.endpoint.removeprefix("tcp://").rsplit(":", 1)
            for _ in range(count):
                with contextlib.suppress(OSError):
                    conn = socket.create_connection((host, int(port)), timeout=5)
                    conn.setblocking(False)
                    self.idle.append(conn)
        return len(self.idle)

    def idle_still_open(self) -> int:
        """Idle connections the nodes have not closed (libzmq closes one whose handshake
        did not complete in 30 s; the in-flight guard one that delivered nothing)."""
        open_ = 0
        for s in self.idle:
            try:
                while s.recv(65536, socket.MSG_DONTWAIT):  # the node's greeting, then EOF
                    pass
            except BlockingIOError:
                open_ += 1
            except OSError:
                pass
        return open_

    def strangers_try(self, count: int) -> None:
        """Clients with no key or an unknown key say HELLO; nothing may come back."""
        socks = []
        for i in range(count):
            target = self.targets[i % len(self.targets)]
            public, secret = zmq.curve_keypair()
            curve = None if i % 2 else CurveClient(public, secret,
                                                   self.ring.public(f"server-{target.shard}"))
            sock = connect_dealer(self.ctx, target.endpoint, 0, curve)
            with contextlib.suppress(zmq.Again):
                sock.send_multipart([b"", *frames_of(hello_message(self.cfg, "worker", 0))],
                                    flags=zmq.NOBLOCK)
            socks.append(sock)
        self.strangers["attempts"] += count
        deadline = time.monotonic() + 2.0
        for sock in socks:
            if sock.poll(max(0, int(1000 * (deadline - time.monotonic())))):
                self.strangers["replies"] += 1
            sock.close(linger=0)

    def run(self, keep_going: Callable[[], bool], progress: Callable[[str], None]) -> float:
        """Every lane's classes, until done (or ``keep_going`` says stop)."""
        started = last = time.monotonic()
        going = True
        while going and keep_going():
            now = time.monotonic()
            going = False
            for lane in self.lanes:
                going = lane.step(self.ctx, self.ring, now) or going
            if going and not any(f.state == "flood" for f in self.floods):
                time.sleep(0.002)  # only waiting for replies
            if now - last > 10:
                last = now
                sent = sum(f.frames for f in self.floods)
                current = [lane.floods[lane.index].kind.name for lane in self.lanes
                           if lane.index < len(lane.floods)]
                progress(f"  {sent:,} hostile frames sent so far ({sent / (now - started):,.0f}"
                         f"/s); now: {', '.join(current)}")
        for lane in self.lanes:
            lane.stop(time.monotonic())
        return time.monotonic() - started

    def status(self, target: Target, key: str = "evaluator") -> StatusReply | None:
        """The STATUS of the server behind ``target`` (its counters)."""
        sock = connect_dealer(self.ctx, target.endpoint, 0,
                              target.curve(self.ring, key))
        try:
            sock.send_multipart([b"", *frames_of(Status())])
            if sock.poll(10_000):
                header = decode(sock.recv_multipart()[1:]).header
                return header if isinstance(header, StatusReply) else None
            return None
        finally:
            sock.close(linger=0)

    def close(self) -> None:
        for s in self.idle:
            s.close()
        self.idle.clear()
        for lane in self.lanes:
            lane.stop(time.monotonic())
        self.ctx.destroy(linger=0)
