"""The key holders' phases of the chaos run (issue 35), each alone against a node of
the running cluster, and what the node pays for it: CPU, peak RSS over the phase's start,
log bytes, and its counters' difference (:func:`keyholder_phases` runs them in turn).

* ``unread``: one worker key's connections that PULL every round and never read (RCVHWM
  1, a 4 KB receive buffer): the node may keep at most a few large replies per key;
* ``bare``: TCP connections that never start a handshake (so no key is known), from
  many loopback addresses, reopened as the node cuts them (:class:`BareFlood`, which
  ``scripts/bench_bare.py`` uses too);
* ``proxy-envelopes``: the proxy's key, straight at the server it fronts, saying HELLO as
  every worker behind made-up envelopes as fast as it can: refused (no worker's
  end-to-end tag), answered within one key's refusal budget whatever the envelope.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from common.net.keys import CurveClient, KeyRing
from common.net.protocol import Hello, Pull, Status, StatusReply, decode, encode
from common.run.config import RunConfig
from ps.chaos.classes import Attackers, hello_message
from ps.chaos.measure import Sampler, last_round, status_kb

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _dealer(ctx: zmq.Context, endpoint: str, curve: CurveClient, reads: bool = True,
            ) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if not reads:  # take one message, then leave the rest in the node's queue
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 4096)
    sock.curve_secretkey, sock.curve_publickey = curve.secret, curve.public
    sock.curve_serverkey = curve.server
    sock.connect(endpoint)
    return sock


def status(ctx: zmq.Context, endpoint: str, curve: CurveClient) -> dict[str, int]:
    """The counters of the server at ``endpoint`` ({} if it did not answer)."""
    sock = _dealer(ctx, endpoint, curve)
    try:
        sock.send_multipart([b"", *encode(Status())])
        if sock.poll(10_000):
            header = decode(sock.recv_multipart()[1:]).header
            if isinstance(header, StatusReply):
                return dict(header.counters)
        return {}
    finally:
        sock.close(0)


class UnreadPuller(threading.Thread):
    """``connections`` connections of one worker key that PULL each new round (as
    ``round_of()`` says) and never read."""

    def __init__(self, endpoint: str, curve: CurveClient, hello: Hello, worker: int,
                 round_of: Callable[[], int], stop: threading.Event,
                 connections: int = 3) -> None:
        super().__init__(name="unread", daemon=True)
        self.endpoint, self.curve, self.hello, self.worker = endpoint, curve, hello, worker
        self.round_of, self.halt, self.connections = round_of, stop, connections
        self.pulls = 0

    def run(self) -> None:
        ctx = zmq.Context()
        socks = [_dealer(ctx, self.endpoint, self.curve, reads=False)
                 for _ in range(self.connections)]
        try:
            for sock in socks:
                sock.send_multipart([b"", *encode(self.hello)])
            pulled = -1
            while not self.halt.wait(0.05):
                current = self.round_of()
                if current == pulled:
                    continue
                for sock in socks:
                    with contextlib.suppress(zmq.Again):
                        sock.send_multipart([b"", *encode(Pull(round=current,
                                                              worker=self.worker))],
                                            zmq.NOBLOCK)
                        self.pulls += 1
                pulled = current
        finally:
            ctx.destroy(linger=0)


class BareFlood:
    """Up to ``limit`` TCP connections to ``host:port`` that never start a handshake,
    from ``sources`` loopback addresses; :meth:`step` drops those the node closed and
    (with ``reopen``) opens new ones up to the limit, 500 at a time."""

    def __init__(self, host: str, port: int, limit: int, sources: int,
                 reopen: bool = True) -> None:
        self.host, self.port, self.limit, self.reopen = host, port, limit, reopen
        self.sources = [f"127.0.0.{k + 1}" for k in range(sources)]
        self.open: list[socket.socket] = []
        self.opened = 0

    def step(self) -> None:
        alive = []
        for sock in self.open:
            try:
                closed = sock.recv(1) == b""
            except BlockingIOError:
                closed = False
            except OSError:
                closed = True
            if closed:
                sock.close()
            else:
                alive.append(sock)
        self.open = alive
        room = self.limit - (len(self.open) if self.reopen else self.opened)
        for _ in range(min(500, room)):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((self.sources[self.opened % len(self.sources)], 0))
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect((self.host, self.port))
            self.open.append(sock)
            self.opened += 1

    def close(self) -> None:
        for sock in self.open:
            sock.close()
        self.open = []


def envelope_flood(endpoint: str, curve: CurveClient, config_hash: str, workers: int,
                   seconds: float) -> dict[str, int]:
    """The proxy's key at the server it fronts: HELLO as each worker behind a new made-up
    envelope, as fast as the socket takes them, for ``seconds``; what came back."""
    ctx = zmq.Context()
    sock = _dealer(ctx, endpoint, curve)
    sock.setsockopt(zmq.SNDHWM, 1000)
    sent = replies = accepted = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            hello = encode(Hello(role="worker", worker=sent % workers, config_hash=config_hash))
            with contextlib.suppress(zmq.Again):
                sock.send_multipart([b"made-up-%d" % sent, b"", *hello], zmq.NOBLOCK)
                sent += 1
            while sock.poll(0):
                frames = sock.recv_multipart()
                replies += 1
                accepted += type(decode(frames[2:]).header).__name__ == "Welcome"
        while sock.poll(500):
            frames = sock.recv_multipart()
            replies += 1
            accepted += type(decode(frames[2:]).header).__name__ == "Welcome"
    finally:
        ctx.destroy(linger=0)
    return {"sent": sent, "replies": replies, "sessions_opened": accepted}


class Phase:
    """What one node pays during a phase: CPU, log bytes and counters, by difference."""

    def __init__(self, pid: int, log: Path, counters: Callable[[], dict[str, int]]) -> None:
        self.pid, self.log, self.counters = pid, log, counters
        self.cpu0, self.log0, self.counters0 = cpu_s(pid), _size(log), counters()
        self.started = time.monotonic()

    def report(self) -> dict:
        seconds = time.monotonic() - self.started
        after = self.counters()
        changed = {k: v - self.counters0.get(k, 0) for k, v in after.items()
                   if v != self.counters0.get(k, 0)}
        return {"seconds": round(seconds, 1),
                "cores": round((cpu_s(self.pid) - self.cpu0) / max(seconds, 1e-9), 3),
                "log_bytes": _size(self.log) - self.log0, "counters": changed}


def _size(path: Path) -> int:
    """Bytes of a log and its rotated files."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def keyholder_phases(cfg: RunConfig, ring: KeyRing, endpoints: dict[str, str],
                     nodes: dict[str, int], out: Path, attackers: Attackers,
                     sampler: Sampler, options: dict, say: Callable[[str], None]) -> dict:
    """Phase 1b: each key holders' attack of issue 35 alone for ``--giant-seconds``, and
    what its node paid (CPU, log bytes, counters, peak RSS over its RSS when the phase
    began)."""
    seconds = options["giant_seconds"]
    ctx = zmq.Context()
    report: dict[str, dict] = {}
    began: dict[str, int] = {}

    def mark(phase: str, node: str) -> None:
        sampler.mark(phase)
        began[phase] = status_kb(nodes[node], "VmRSS")

    def grown(phase: str, node: str) -> float:
        return round((sampler.peaks[phase][node] - began[phase]) / 1024, 1)

    def watch(node: str, shard: int) -> Phase:
        return Phase(nodes[node], out / "logs" / f"{node}.log",
                     lambda: status(ctx, endpoints[node], ring.client_curve("evaluator", shard)))

    try:
        say(f"unread: worker-{attackers.flood}'s 3 connections PULL every round at server-1 "
            "and never read")
        mark("unread", "server-1")
        phase, stop = watch("server-1", 1), threading.Event()
        puller = UnreadPuller(endpoints["server-1"],
                              ring.client_curve(f"worker-{attackers.flood}", 1),
                              hello_message(cfg, "worker", attackers.flood), attackers.flood,
                              lambda: last_round(out / "server-1.jsonl"), stop)
        puller.start()
        stop.wait(seconds)
        stop.set()
        puller.join()
        report["unread"] = {**phase.report(), "pulls": puller.pulls,
                            "rss_growth_mb": grown("unread", "server-1")}
        say(f"bare: up to {options['bare']:,} connections that never start a handshake at "
            "server-1, from 16 addresses")
        mark("bare", "server-1")
        phase = watch("server-1", 1)
        host, port = endpoints["server-1"].removeprefix("tcp://").rsplit(":", 1)
        flood = BareFlood(host, int(port), options["bare"], 16)
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                flood.step()
                time.sleep(0.02)
        finally:
            opened = flood.opened
            flood.close()
        report["bare"] = {**phase.report(), "opened": opened,
                          "rss_growth_mb": grown("bare", "server-1")}
        say("proxy-envelopes: proxy-0's key at server-0, HELLO as every worker behind "
            "made-up envelopes")
        mark("proxy-envelopes", "server-0")
        phase = watch("server-0", 0)
        sent = envelope_flood(endpoints["server-0"], ring.client_curve("proxy-0", 0),
                              cfg.config_hash, cfg.num_workers, seconds)
        report["proxy-envelopes"] = {**phase.report(), **sent,
                                     "rss_growth_mb": grown("proxy-envelopes", "server-0")}
    finally:
        ctx.destroy(linger=0)
    for name, r in report.items():
        say(f"{name}: {r}")
    return report
