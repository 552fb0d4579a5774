"""Chaos: an honest keyed cluster trains while insiders holding the keys of its Byzantine
workers (and the evaluator's) attack one server and one proxy; what does each node pay?

    python3 scripts/chaos.py                    # 100,000 frames of each class per target
    python3 scripts/chaos.py --frames 2000      # a quick look
    git worktree add --detach /tmp/chaos-before c9cfc53   # the code before the insider
    python3 scripts/chaos.py --before-tree /tmp/chaos-before   # changes: its CPU too
    git worktree remove /tmp/chaos-before

The run: n workers (``--workers``), of which only the first ``--honest`` h run; workers
h..n-1 are Byzantine and never run as honest processes: their keys are the attackers'.
The servers close a round at its deadline (``--round-timeout``) with a quorum of the h
honest workers (q = n - h), so the run goes on without the absent and barred workers;
afterwards the reference engine replays the participation the servers recorded and must
end bit-identical. The proxy in front of shard 0 runs a value-level attack (gambler: an
attack that holds whole rounds cannot run with a deadline).

The attackers' keys (bars hit only them):

* ``worker-h``: every flood class that speaks as a worker, and the straggler, which says
  HELLO (accepted) six times per deadline and never pushes: every round of the attack
  waits for its deadline (the most a present but slow worker costs), which also paces
  the run so that it outlasts the attack and leaves the attack the CPU;
* ``worker-h+1``: ``oversize``, a message larger than any legal one, again and again
  (delivered ``too-large``: the key is barred at that node);
* ``worker-h+2``: ``giant``, messages of 2 GB in 4 MiB frames (one 4 MiB buffer referenced
  512 times, zero-copy), each on a new connection after one STATUS (the node attributes
  a connection to its key by a delivered message);
* ``worker-h+3``: ``giant-silent``, the same with the 2 GB message as the first one;
* ``evaluator``: the read-only classes (HELLO as a monitor, forged envelopes) at
  server-1; at proxy-0, which admits the workers' keys only, they use ``worker-h``.

Phases (the targets are server-1 and proxy-0):

1. ``giant`` alone at server-1 for ``--giant-seconds`` (its RSS peak is its own), then
   ``giant-silent`` alone as long; both go on reconnecting until the attack ends; then
   the key holders' phases of ``scripts/chaos_keyholders.py``, each alone as long:
   ``unread`` (a key's connections that PULL and never read, at server-1), ``bare``
   (``--bare-connections`` that never start a handshake, at server-1),
   ``proxy-envelopes`` (proxy-0's key at server-0, HELLO as every worker behind made-up
   envelopes), each with the CPU, peak RSS, log bytes and counters it cost;
2. the floods: at each target its classes one after another (on one connection per key:
   a node admits a key's handshakes a few at a time), each asking STATUS before and
   after (the node answers a connection in order, so the second reply comes after every
   reply of the class, and the counters' difference is the class's); a class waits at
   most ``--window-wait`` for replies the node may drop (refusals beyond 100/s per key
   go unanswered). Meanwhile ``oversize`` at both targets,
   ``--idle-connections`` idle TCP connections per target (a node closes them: libzmq
   after its handshake timeout, the in-flight guard's idle cut), ``--strangers`` without
   a key;
3. after the run: the CPU a standalone server spends on the most expensive headers it
   still accepts or answers, from one key (``--cpu-messages``), with this code and, with
   ``--before-tree``, the code of that checkout.

It prints a table per class and a JSON summary: crashes (must be 0), bit_identical (must
be true), per class the messages answered, left without reply (its own count) and
dropped (the node's ``unanswered`` counter; a proxy exposes no counters), the bars, peak
RSS (VmRSS every 20 ms, per phase) over the baseline, connections a key got after its
first offence (handshakes its sockets' monitors saw succeed), log bytes (with rotated
files) per 100,000 hostile frames, CPU-ms per 1,000 worst accepted headers.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click
import msgpack
import numpy as np
import zmq
from chaos_keyholders import BareFlood, Phase, UnreadPuller, envelope_flood, status
from zmq.utils.monitor import recv_monitor_message

from common.config import AttackConfig, RunConfig
from common.keys import CurveClient, KeyRing, SecurityOptions, create_keys
from common.metrics import read_jsonl
from common.process import pin_torch_threads
from common.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Error,
    Hello,
    Op,
    ProtocolError,
    Pull,
    Push,
    Status,
    StatusReply,
    Welcome,
    decode,
    encode,
)
from common.transport import configure, connect_dealer, largest_message
from ps.launcher.cluster import BackgroundRun, Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.launcher.processes import die_with_parent
from ps.launcher.report import ClusterResult
from ps.reference.engine import simulate
from ps.reference.participation import read_participation
from server.options import ServerOptions

Frames = list[bytes]

HELLO_WAIT_S = 10.0  # a class's HELLO and first STATUS
SYNC_WAIT_S = 60.0  # a class's last STATUS, behind everything it sent
SAMPLE_S = 0.02  # RSS sampling interval
GIANT_FRAME_BYTES = 4 << 20
GIANT_FRAMES = 512  # 2 GB
OFFENDER_HOLD_S = 5.0  # how long an offender's connection waits to be cut
OFFENDER_PAUSE_S = 0.05  # before it reconnects
SENT_PER_STEP = 64
STALL_S = 30.0  # a class that can send nothing and gets nothing back this long ends
BYZANTINE_KEYS = 4  # flood, oversize, giant, giant-silent

_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
           | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
           | zmq.EVENT_DISCONNECTED)
_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


@dataclass(frozen=True)
class Target:
    """A node under attack: its name, endpoint, shard and the shard's size."""

    name: str
    endpoint: str
    shard: int
    shard_size: int

    def curve(self, ring: KeyRing, key: str) -> CurveClient:
        """What ``key`` connects to this node with (a proxy presents its own key)."""
        return ring.client_curve(key, self.shard, via_proxy=self.name.startswith("proxy-"))


@dataclass(frozen=True)
class Attackers:
    """The worker ids whose keys the attackers hold (Byzantine workers that never run)."""

    flood: int
    oversize: int
    giant: int
    silent: int

    @classmethod
    def after(cls, honest: int) -> Attackers:
        return cls(honest, honest + 1, honest + 2, honest + 3)


# (target, cfg, i, the target's round as its last ERROR said, the key's worker id)
Builder = Callable[[Target, RunConfig, int, int, int], Frames]


@dataclass(frozen=True)
class HostileClass:
    """A kind of hostile message: whose key sends it, whether it says HELLO first."""

    name: str
    key: str  # "worker" (the flood key, worker-h) or "evaluator"
    message: Builder
    hello: bool = False  # says HELLO as the key's worker before the flood
    raw: bool = False  # the frames carry their own (forged or missing) envelope
    window: int | None = None  # at most this many unanswered (to track the round)


def _header(body: dict) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, **body})


def _frames(header, tensor: np.ndarray | None = None) -> Frames:
    return [bytes(f) for f in encode(header, tensor)]


@functools.lru_cache(maxsize=4096)
def _push(target: Target, round_: int, worker: int, size: int | None = None) -> Frames:
    values = np.zeros(target.shard_size if size is None else size, dtype=np.float32)
    return _frames(Push(round=round_, worker=worker, length=values.size), values)


def _hello(cfg: RunConfig, role: str, worker: int) -> Hello:
    return Hello(role=role, worker=worker, config_hash=cfg.config_hash, config=cfg.to_dict())


def _oversize(target: Target, worker: int) -> Frames:
    """A push whose frames add up to more than the largest legal message (16 KiB each)."""
    chunk = b"\x00" * 16384
    count = largest_message(target.shard_size) // len(chunk) + 2
    header = _header({"op": int(Op.PUSH), "round": 0, "worker": worker,
                      "length": count * len(chunk) // 4})
    return [b"", header, *[chunk] * count]


@functools.cache
def _giant_chunk() -> bytes:
    return bytes(GIANT_FRAME_BYTES)


def _giant() -> Frames:
    """A 2 GB message: the same 4 MiB buffer 512 times (sent with copy=False)."""
    return [b"", *[_giant_chunk()] * GIANT_FRAMES]


def hostile_classes(cfg: RunConfig) -> list[HostileClass]:
    """The flood classes of the issue's table that reach a node behind the handshake."""
    status = _frames(Status())
    bad_config = {**cfg.to_dict(), b"lr": 9.0, "rule": [1, {2: 3}]}
    beyond = cfg.rounds + 1  # a round no run of these settings ever reaches
    monitor = _hello(cfg, "monitor", -1)
    worker, reader = "worker", "evaluator"
    return [
        HostileClass("garbage", worker, lambda t, c, i, r, w: [b"\xc1" + os.urandom(16)]),
        HostileClass("bad-version", worker, lambda t, c, i, r, w: [
            _header({"v": PROTOCOL_VERSION + 9, "op": int(Op.STATUS)})]),
        HostileClass("unknown-op", worker, lambda t, c, i, r, w: [_header({"op": 77})]),
        HostileClass("truncated-tensor", worker, lambda t, c, i, r, w: [_header(
            {"op": int(Op.PUSH), "round": 0, "worker": w, "length": t.shard_size}),
            b"\0" * 8]),
        HostileClass("no-hello", worker, lambda t, c, i, r, w: _frames(Pull(round=0, worker=w))),
        # pushes as the honest workers 0..2 with the attacker's own key
        HostileClass("impersonation", worker, lambda t, c, i, r, w: _push(t, 0, i % 3)),
        HostileClass("bad-config-hello", worker, lambda t, c, i, r, w: [msgpack.packb(
            {"v": PROTOCOL_VERSION, "op": int(Op.HELLO), "role": "worker", "worker": w,
             "config_hash": "0" * 16, "config": bad_config})]),
        HostileClass("no-delimiter", worker, lambda t, c, i, r, w: [b"\x01" * 5], raw=True),
        # with a session: said HELLO first, as the worker whose key they hold
        HostileClass("bad-worker-or-round", worker,
                     lambda t, c, i, r, w: _push(t, 0, -1) if i % 2 else _push(t, -1, w),
                     hello=True),
        HostileClass("wrong-length", worker, lambda t, c, i, r, w: _push(t, r, w, 1 + i % 7),
                     hello=True, window=16),
        HostileClass("future-rounds", worker,
                     lambda t, c, i, r, w: _push(t, beyond + i % 600, w), hello=True),
        HostileClass("pull-flood", worker, lambda t, c, i, r, w: _frames(
            Pull(round=min(r + 200 + i % 3, c.rounds), worker=w)), hello=True),
        # forged envelopes with the evaluator's key
        HostileClass("hello-flood", reader,
                     lambda t, c, i, r, w: [os.urandom(5), b"", *_frames(monitor)], raw=True),
        HostileClass("large-routing-ids", reader,
                     lambda t, c, i, r, w: [b"r" * 100_000, b"", *status], raw=True),
        HostileClass("deep-envelope", reader, lambda t, c, i, r, w: [
            *[os.urandom(5) for _ in range(8)], b"", *status], raw=True),
    ]


def _reply_header(frames: list[bytes]):
    """The header of a reply a DEALER received (None: undecodable)."""
    body = frames[frames.index(b"") + 1:] if b"" in frames else frames
    try:
        return decode(body).header
    except ProtocolError:
        return None


@dataclass
class Flood:
    """One class at one target, on its lane's connection of its key: HELLO (if the class
    says one), STATUS, the flood, STATUS; what came back in between is the class's (the
    node answers one connection in order)."""

    target: Target
    kind: HostileClass
    key: str
    worker: int  # the key's worker id (-1: the evaluator's key)
    cfg: RunConfig
    quota: int
    window_wait_s: float
    sock: zmq.Socket | None = None
    state: str = "new"  # new, hello, before, flood, sync, done
    outbox: Frames | None = None  # a HELLO or STATUS the send queue did not take yet
    messages: int = 0
    frames: int = 0
    round: int = 0  # the target's current round, as its last reply said
    outstanding: int = 0  # messages sent that no reply answered yet
    windows_given_up: int = 0  # waits for replies that ended after window_wait_s
    stalled: bool = False  # nothing went out or came back for STALL_S
    replies: Counter[str] = field(default_factory=Counter)
    hello_reply: str | None = None
    before: dict | None = None  # the node's counters before and after the class
    after: dict | None = None
    started: float = 0.0
    seconds: float = 0.0
    deadline: float = 0.0
    last_progress: float = 0.0

    def open(self, sock: zmq.Socket, now: float) -> None:
        """Start on ``sock`` (the lane's connection of this class's key)."""
        self.sock = sock
        self.started = now
        if self.kind.hello:
            self._say([b"", *_frames(_hello(self.cfg, "worker", self.worker))], "hello", now)
        else:
            self._say([b"", *_frames(Status())], "before", now)

    def step(self, now: float) -> bool:
        """Read what came back, send some more; whether the class is still going."""
        while self.state != "done":
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            self._take(_reply_header(frames), now)
        if self.state == "done":
            return False
        if self.outbox is not None:
            self._flush()
        elif self.state == "flood":
            self._send_some(now)
        if self.state == "flood" and now - self.last_progress > STALL_S:
            self.stalled = True  # the node takes nothing from this connection
            self._finish(now)
        elif self.state in ("hello", "before", "sync") and now > self.deadline:
            if self.state == "hello":
                self._say([b"", *_frames(Status())], "before", now)
            elif self.state == "before":
                self._enter("flood", now)
            else:
                self._finish(now)
        return self.state != "done"

    def _enter(self, state: str, now: float) -> None:
        wait_s = {"hello": HELLO_WAIT_S, "before": HELLO_WAIT_S, "sync": SYNC_WAIT_S}
        self.state, self.last_progress = state, now
        self.deadline = now + wait_s.get(state, 0.0)

    def _say(self, frames: Frames, state: str, now: float) -> None:
        """Send ``frames`` (a HELLO or STATUS; as soon as the send queue takes them) and
        wait for the reply in ``state``."""
        self.outbox = frames
        self._enter(state, now)
        self._flush()

    def _flush(self) -> None:
        with contextlib.suppress(zmq.Again):
            self.sock.send_multipart(self.outbox, flags=zmq.NOBLOCK)
            self.outbox = None

    def _take(self, header, now: float) -> None:
        if self.state == "hello":  # the answer to the class's HELLO
            self.hello_reply = header.code if isinstance(header, Error) else (
                type(header).__name__.lower() if header is not None else "undecodable")
            self._say([b"", *_frames(Status())], "before", now)
            return
        if isinstance(header, StatusReply) and self.state in ("before", "sync"):
            if self.state == "before":
                self.before = dict(header.counters)
                self._enter("flood", now)
            else:
                self.after = dict(header.counters)
                self._finish(now)
            return
        self.outstanding = max(0, self.outstanding - 1)
        self.last_progress = now
        if header is None:
            self.replies["undecodable"] += 1
        elif isinstance(header, Error):
            self.round = max(self.round, header.round)
            self.replies[header.code] += 1
        else:
            if isinstance(header, Ack):  # a repeat: that round was pushed already
                self.round = max(self.round, header.round + 1)
            self.replies[type(header).__name__.lower()] += 1

    def _send_some(self, now: float) -> None:
        """Up to ``SENT_PER_STEP`` messages, as many as the socket takes without blocking;
        a window waits at most ``window_wait_s`` for replies the node may have dropped."""
        window = self.kind.window
        for _ in range(SENT_PER_STEP):
            if self.frames >= self.quota:
                self._say([b"", *_frames(Status())], "sync", now)
                return
            if window is not None and self.outstanding >= window:
                if now - self.last_progress < self.window_wait_s:
                    return
                self.windows_given_up += 1
                self.outstanding = 0
            frames = self.kind.message(self.target, self.cfg, self.messages, self.round,
                                       self.worker)
            out = frames if self.kind.raw else [b"", *frames]
            try:
                self.sock.send_multipart(out, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.messages += 1
            self.frames += len(out)
            self.outstanding += 1
            self.last_progress = now

    def _finish(self, now: float) -> None:
        self.seconds = now - self.started
        self.state = "done"

    @property
    def clean(self) -> bool:
        """Its last STATUS came back: nothing of it is left on the connection."""
        return self.after is not None

    def stop(self, now: float) -> None:
        """End the class where it is (the run is ending)."""
        if self.sock is not None and self.state != "done":
            self._finish(now)

    @property
    def answered(self) -> int:
        return sum(self.replies.values())

    def report(self, barred: bool) -> dict:
        delta = None
        if self.before is not None and self.after is not None:
            delta = {k: v - self.before.get(k, 0) for k, v in self.after.items()
                     if v != self.before.get(k, 0)}
        # a proxy relays STATUS: the counters are those of the server behind it, which
        # sees only what the proxy relays (the proxy's own counters are not exposed)
        own = not self.target.name.startswith("proxy")
        return {
            "target": self.target.name, "class": self.kind.name, "key": self.key,
            "frames": self.frames, "messages": self.messages,
            "answered": self.answered,
            # messages no reply came back for (the node dropped the refusal, or parked
            # a PULL it answers later)
            "no_reply": self.messages - self.answered,
            # the node's own count of refusals it dropped without reply during the class
            # (None: not known, at a proxy or when a STATUS went unanswered)
            "unanswered_by_node": None if delta is None or not own
            else delta.get("unanswered", 0),
            "replies": dict(self.replies),
            "hello": self.hello_reply,
            ("server_counters_delta" if own else "counters_delta_of_the_server_behind"): delta,
            "windows_given_up": self.windows_given_up,
            "stalled": self.stalled,
            "seconds": round(self.seconds, 2),
            "barred": barred,
        }


@dataclass
class Lane:
    """The classes at one target, one after another, on one connection per key (a node
    admits a key's handshakes only a few at a time); a class that ended without its last
    STATUS leaves its connection to no other."""

    floods: list[Flood]
    index: int = 0
    socks: dict[str, zmq.Socket] = field(default_factory=dict)

    def step(self, ctx: zmq.Context, ring: KeyRing, now: float) -> bool:
        while self.index < len(self.floods):
            flood = self.floods[self.index]
            if flood.state == "new":
                flood.open(self._sock(ctx, ring, flood), now)
            if flood.step(now):
                return True
            if not flood.clean:
                self.socks.pop(flood.key).close(linger=0)
            self.index += 1
        self.close()
        return False

    def _sock(self, ctx: zmq.Context, ring: KeyRing, flood: Flood) -> zmq.Socket:
        sock = self.socks.get(flood.key)
        if sock is None:
            sock = self.socks[flood.key] = connect_dealer(
                ctx, flood.target.endpoint, 0, flood.target.curve(ring, flood.key))
            sock.setsockopt(zmq.SNDHWM, 200)
        return sock

    def stop(self, now: float) -> None:
        for flood in self.floods:
            flood.stop(now)
        self.close()

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(linger=0)
        self.socks.clear()


class Offender(threading.Thread):
    """A class that breaks a hard limit, from one key, again and again: each time a new
    DEALER (the same key) sends the message and waits to be cut; every handshake
    that succeeded after the first cut is a connection the key got after its offence."""

    def __init__(self, name: str, target: Target, curve: CurveClient, message: Frames,
                 announce: bool, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.label, self.target, self.curve = name, target, curve
        self.message, self.announce, self.halt = message, announce, stop
        self.attempts = self.handshakes = self.refused = self.cuts = self.not_cut = 0
        self.after_offence = 0  # handshakes that succeeded after the first cut
        self.first_offence: float | None = None
        self.started_at: float | None = None

    def run(self) -> None:
        ctx = zmq.Context()
        self.started_at = time.monotonic()
        try:
            while not self.halt.is_set():
                self._attempt(ctx)
                self.halt.wait(OFFENDER_PAUSE_S)
        finally:
            ctx.destroy(linger=0)

    def _attempt(self, ctx: zmq.Context) -> None:
        sock = configure(ctx.socket(zmq.DEALER), 0)  # as connect_dealer, but the monitor
        sock.curve_secretkey = self.curve.secret  # sees every event of the connection
        sock.curve_publickey = self.curve.public
        sock.curve_serverkey = self.curve.server
        sock.setsockopt(zmq.SNDTIMEO, 1000)
        monitor = sock.get_monitor_socket(_EVENTS)
        sock.connect(self.target.endpoint)
        try:
            with contextlib.suppress(zmq.Again):  # (the events below say what happened)
                if self.announce:  # a first message: the node attributes the connection
                    sock.send_multipart([b"", *_frames(Status())])
                sock.send_multipart(self.message, copy=False)
            self.attempts += 1
            connected = False
            deadline = time.monotonic() + OFFENDER_HOLD_S
            while time.monotonic() < deadline and not self.halt.is_set():
                if not monitor.poll(50):
                    continue
                event = recv_monitor_message(monitor)["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.handshakes += 1
                    connected = True
                    if self.first_offence is not None:
                        self.after_offence += 1
                elif event & _FAILED:
                    self.refused += 1
                    return
                elif event == zmq.EVENT_DISCONNECTED and connected:
                    self.cuts += 1
                    if self.first_offence is None:
                        self.first_offence = time.monotonic()
                    return
            if connected:
                self.not_cut += 1
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)

    def report(self, barred: bool) -> dict:
        return {
            "target": self.target.name, "attempts": self.attempts,
            "handshakes": self.handshakes, "cuts": self.cuts,
            "handshakes_refused": self.refused, "connections_not_cut": self.not_cut,
            "connections_after_first_offence": self.after_offence,
            "first_offence_after_s": None if self.first_offence is None
            else round(self.first_offence - self.started_at, 2),
            "barred": barred,
        }


class Straggler(threading.Thread):
    """A Byzantine worker that says HELLO (accepted) six times per round deadline and
    never pushes: present, so every round waits for its deadline, the most a worker that is
    there but slow can cost. It also paces the run while the attack lasts (a round per
    deadline), so that the run outlasts the attack and leaves the attack the CPU."""

    def __init__(self, target: Target, curve: CurveClient, hello: Hello, interval_s: float,
                 stop: threading.Event) -> None:
        super().__init__(name="straggler", daemon=True)
        self.target, self.curve, self.hello = target, curve, [b"", *_frames(hello)]
        self.interval_s, self.halt = interval_s, stop
        self.hellos = self.welcomes = 0

    def run(self) -> None:
        ctx = zmq.Context()
        sock = connect_dealer(ctx, self.target.endpoint, 0, self.curve)
        try:
            while True:
                with contextlib.suppress(zmq.Again):
                    sock.send_multipart(self.hello, flags=zmq.NOBLOCK)
                    self.hellos += 1
                if self.halt.wait(self.interval_s):
                    return
                while sock.poll(0):
                    self.welcomes += isinstance(_reply_header(sock.recv_multipart()), Welcome)
        finally:
            ctx.destroy(linger=0)


def _status_kb(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """VmRSS and VmHWM of the nodes every ``SAMPLE_S``, the peaks kept per phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pids = pids
        self.baseline = {n: _status_kb(p, "VmRSS") for n, p in pids.items()}
        self.hwm_before = {n: _status_kb(p, "VmHWM") for n, p in pids.items()}
        self.phase = "start"
        self.peaks: dict[str, dict[str, int]] = {"start": dict(self.baseline)}
        self.hwm_at: dict[str, dict[str, int]] = {"start": dict(self.hwm_before)}
        self.overall = dict(self.baseline)
        self.peak_at: dict[str, tuple[str, float]] = {}  # name -> (phase, seconds in)
        self.started = self.phase_started = time.monotonic()
        self.samples = 0
        self.halt = threading.Event()

    def mark(self, phase: str) -> None:
        self.hwm_at[phase] = {n: _status_kb(p, "VmHWM") for n, p in self.pids.items()}
        self.peaks[phase] = {n: _status_kb(p, "VmRSS") for n, p in self.pids.items()}
        self.phase, self.phase_started = phase, time.monotonic()

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            peaks = self.peaks[self.phase]
            for name, pid in self.pids.items():
                rss = _status_kb(pid, "VmRSS")
                peaks[name] = max(peaks[name], rss)
                if rss > self.overall[name]:
                    self.overall[name] = rss
                    self.peak_at[name] = (self.phase, time.monotonic() - self.phase_started)
            self.samples += 1

    def growth_mb(self, phase: str | None = None) -> dict[str, float]:
        peaks = self.overall if phase is None else self.peaks[phase]
        return {n: round((peaks[n] - self.baseline[n]) / 1024, 1) for n in self.pids}

    def hwm_growth_mb(self, since: str, until: str | None = None) -> dict[str, float]:
        end = self.hwm_at[until] if until else {n: _status_kb(p, "VmHWM")
                                                for n, p in self.pids.items()}
        return {n: round(max(0, end[n] - self.hwm_at[since][n]) / 1024, 1) for n in self.pids}


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
                sock.send_multipart([b"", *_frames(_hello(self.cfg, "worker", 0))],
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
            sock.send_multipart([b"", *_frames(Status())])
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


class ChaosCluster(Cluster):
    """The launcher's cluster, starting only the honest workers 0..h-1 (the others'
    keys are the attackers'); no worker may be lost (the quorum is all h of them, so
    the supervisor has no spare worker)."""

    def __init__(self, spec: ClusterSpec, honest: int) -> None:
        super().__init__(spec)
        self.teams = {i: (i,) for i in range(honest)}  # a process per honest worker

    def _start_workers(self, endpoints: list[str]) -> None:
        for i, team in self.teams.items():
            self._child(f"worker-{i}", "worker.cli", self.worker_argv(team, endpoints))


@click.command(context_settings={"show_default": True})
@click.option("--frames", "quota", default=100_000, type=int,
              help="Hostile frames of every flood class at each target.")
@click.option("--workers", default=10, type=int, help="n: the run's workers.")
@click.option("--honest", default=6, type=int,
              help="Workers 0..h-1 run; the keys of the others are the attackers' (at least "
              f"{BYZANTINE_KEYS} of them); q = n - h and the quorum is h.")
@click.option("--shards", default=4, type=int)
@click.option("--rounds", default=None, type=int,
              help="Honest rounds; enough that the run outlasts the attack, at a round per "
              "--round-timeout while it lasts (the attack stops 20 rounds before the end). "
              "Default: max(1000, FRAMES / 12).")
@click.option("--rule", default="marmed")
@click.option("--proxy-attack", default="gambler",
              help="The proxy in front of shard 0 (one that holds whole rounds cannot run "
              "with a round deadline).")
@click.option("--round-timeout", default=0.3, type=float,
              help="Seconds a round waits for a worker that is not absent (a Byzantine key "
              "that says HELLO or pushes is present again).")
@click.option("--idle-connections", default=1100, type=int,
              help="Idle TCP connections opened to each target during the floods.")
@click.option("--strangers", default=200, type=int,
              help="Connection attempts with no key or an unknown key.")
@click.option("--giant-seconds", default=20.0, type=float,
              help="Seconds each 2 GB class, and each key holders' phase (unread replies, "
              "bare connections, a proxy key's envelopes), runs alone before the floods.")
@click.option("--bare-connections", default=10_000, type=int,
              help="Connections that never start a handshake kept open at server-1 (the "
              "bare phase), opened again as it cuts them.")
@click.option("--window-wait", default=0.05, type=float,
              help="Seconds a windowed class waits for replies before it goes on.")
@click.option("--cpu-messages", default=3000, type=int,
              help="Messages of each candidate header in the CPU measurement (0: skip it).")
@click.option("--before-tree", default=None, type=click.Path(path_type=Path, file_okay=False,
                                                              exists=True),
              help="A checkout of the code before the insider changes (git worktree add "
              "--detach DIR c9cfc53): measure its server's CPU on the same headers.")
@click.option("--run-timeout", default=4 * 3600.0, type=float,
              help="Stop the cluster (a failure) after this many seconds.")
@click.option("--keep", default=None, type=click.Path(path_type=Path, file_okay=False),
              help="Copy the run's logs and metrics here (default: they go with the temporary "
              "directory).")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def main(quota: int, workers: int, honest: int, shards: int, rounds: int | None, rule: str,
         proxy_attack: str, round_timeout: float, idle_connections: int, strangers: int,
         giant_seconds: float, bare_connections: int, window_wait: float, cpu_messages: int,
         before_tree: Path | None, run_timeout: float, keep: Path | None,
         json_path: Path | None) -> None:
    if workers - honest < BYZANTINE_KEYS or honest < 1:
        raise click.BadParameter(f"needs 1 <= --honest <= n - {BYZANTINE_KEYS} (the "
                                 "attackers hold the keys of workers h..h+3)")
    rounds = rounds or max(1000, quota // 12)
    settings = {"dataset": "synthetic", "num_workers": workers, "num_shards": shards,
                "rule": rule, "q": workers - honest, "rounds": rounds, "seed": 7}
    cfg = RunConfig.from_settings(**settings).validate()
    attack = AttackConfig.build(proxy_attack=proxy_attack, proxy_shards=(0,)).validate(cfg)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        keys = out / "keys"
        create_keys(keys, shards, workers, proxies=(0,))
        spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=out / "run",
                           cluster=ClusterOptions(no_evaluator=False, max_restarts=0,
                                                  run_timeout_s=run_timeout,
                                                  server_processes=shards),  # server-1
                           server=ServerOptions(round_timeout=str(round_timeout), quorum=honest),
                           security=SecurityOptions(keys=keys))
        options = {"idle": idle_connections, "strangers": strangers,
                   "giant_seconds": giant_seconds, "bare": bare_connections,
                   "window_wait_s": window_wait,
                   "pace_s": round_timeout}
        report = _attack_cluster(spec, KeyRing(keys), quota, honest, options)
        if keep is not None:
            shutil.copytree(spec.out_dir, keep, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("keys", "*.npz"))
        if cpu_messages > 0:
            trees = {"after": Path(__file__).resolve().parents[1]}
            if before_tree is not None:
                trees["before"] = before_tree.resolve()
            cpu = {label: worst_headers(tree, keys, settings, cpu_messages, out / f"cpu-{label}",
                                        Attackers.after(honest).flood)
                   for label, tree in trees.items()}
            report["summary"]["cpu_ms_per_1000_worst_accepted"] = _cpu_summary(cpu)
            report["cpu"] = cpu
    report["summary"]["wall_seconds"] = round(time.monotonic() - started, 1)
    click.echo(json.dumps(report["summary"], indent=2))
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    ok = report["summary"]["crashes"] == 0 and report["summary"]["bit_identical"]
    raise SystemExit(0 if ok else 1)


def _attack_cluster(spec: ClusterSpec, ring: KeyRing, quota: int, honest: int,
                    options: dict) -> dict:
    cfg = spec.cfg
    attackers = Attackers.after(honest)
    cluster = ChaosCluster(spec, honest)
    launched = time.monotonic()
    run = BackgroundRun(cluster)
    out = spec.out_dir
    endpoints = _await(out / "run", ["server-0", "server-1", "proxy-0"], run)
    _await_round(out / "server-0.jsonl", run)
    nodes = {p.name: p.pid for p in cluster.processes
             if p.name.startswith(("server", "proxy")) and p.pid is not None}
    shard_sizes = _shard_sizes(cfg)
    server = Target("server-1", endpoints["server-1"], 1, shard_sizes[1])
    proxy = Target("proxy-0", endpoints["proxy-0"], 0, shard_sizes[0])
    targets = [server, proxy]
    logs = {t.name: out / "logs" / f"{t.name}.log" for t in targets}
    logs_before = {name: _log_bytes(path) for name, path in logs.items()}
    sampler = Sampler(nodes)
    sampler.start()
    halt = threading.Event()

    checked = {"at": 0.0, "going": True}

    def keep_going() -> bool:  # (the metrics file is read at most twice a second)
        now = time.monotonic()
        if now - checked["at"] > 0.5:
            checked["at"] = now
            checked["going"] = (run.alive
                                and _last_round(out / "server-0.jsonl") < cfg.rounds - 20)
        return checked["going"]

    def say(line: str) -> None:
        click.echo(f"[{time.monotonic() - launched:6.1f} s] {line}", err=True)

    round_at_start = _last_round(out / "server-0.jsonl")
    giant_keys = {"giant": f"worker-{attackers.giant}",
                  "giant-silent": f"worker-{attackers.silent}"}
    giants = {name: Offender(name, server, ring.client_curve(key, server.shard), _giant(),
                             name == "giant", halt) for name, key in giant_keys.items()}
    oversize = {t.name: Offender(f"oversize@{t.name}", t, t.curve(
        ring, f"worker-{attackers.oversize}"), _oversize(t, attackers.oversize), True, halt)
        for t in targets}
    hostile = Attack(cfg, ring, targets, quota, attackers, options["window_wait_s"])
    straggler = Straggler(server, ring.client_curve(f"worker-{attackers.flood}", server.shard),
                          _hello(cfg, "worker", attackers.flood), options["pace_s"] / 6, halt)
    phases: dict[str, float] = {}
    attack_started = time.monotonic()
    try:
        straggler.start()
        for name, offender in giants.items():  # phase 1: each 2 GB class alone
            say(f"{name}: 2 GB messages from {giant_keys[name]} at server-1 for "
                f"{options['giant_seconds']:g} s")
            sampler.mark(name)
            begun = time.monotonic()
            offender.start()
            halt.wait(options["giant_seconds"])
            phases[name] = time.monotonic() - begun
        keyholders = _keyholder_phases(cfg, ring, endpoints, nodes, out, attackers, sampler,
                                       options, say)
        sampler.mark("floods")  # phase 2: the floods (the giants go on)
        begun = time.monotonic()
        for offender in oversize.values():
            offender.start()
        held = hostile.hold_idle_connections(options["idle"])
        say(f"holding {held} idle connections; {len(hostile.floods)} classes of {quota:,} "
            f"frames, one after another at each target")
        hostile.strangers_try(options["strangers"])
        seconds = hostile.run(keep_going, say)
        phases["floods"] = time.monotonic() - begun
        say(f"floods over after {seconds:.1f} s")
        idle_open = hostile.idle_still_open()
        round_at_end = _last_round(out / "server-0.jsonl")
        counters = {"server-1": s.counters if (s := hostile.status(server)) else None,
                    "server-0 (behind proxy-0)": s.counters if (s := hostile.status(
                        proxy, f"worker-{attackers.flood}")) else None}
    finally:
        halt.set()
        attack_seconds = time.monotonic() - attack_started
        for offender in [*giants.values(), *oversize.values(), straggler]:
            if offender.is_alive():
                offender.join()
        sampler.halt.set()
        hostile.close()
    logs_after = {name: _log_bytes(path) for name, path in logs.items()}
    rss = {"baseline_mb": {n: round(v / 1024, 1) for n, v in sampler.baseline.items()},
           "samples": sampler.samples,
           "giant_alone": sampler.growth_mb("giant"),
           "giant_silent_alone": sampler.growth_mb("giant-silent"),
           "floods": sampler.growth_mb("floods"),
           "high_water_mark_growth_mb": sampler.hwm_growth_mb("start"),
           "overall": sampler.growth_mb(),
           "peak_at": {n: f"{phase} +{t:.2f} s" for n, (phase, t) in sampler.peak_at.items()}}
    say("attack over; waiting for the run to finish")
    result = run.join()
    crashes = [p.name for p in cluster.processes
               if p.returncode not in (0, None)]
    crashes += [f"{r['process']} (restarted)" for r in cluster.supervisor.restarts]
    if isinstance(result, BaseException):  # the honest run did not finish
        crashes.append((str(result).splitlines() or [repr(result)])[0][:300])
    reference, replayed = None, None
    if isinstance(result, ClusterResult):
        replayed = read_participation(out, cfg.num_shards, cfg.num_workers, cfg.rounds)
        pin_torch_threads(1)  # as the workers compute: the same sums in the same order
        reference = simulate(cfg, spec.attack, participation=replayed)
    server_lines = read_jsonl(out / "server-1.jsonl")
    barred = {"server-1": server_lines[-1].get("barred", []) if server_lines else [],
              "proxy-0": _barred_in_log(logs["proxy-0"])}
    classes = [f.report(f.key in barred[f.target.name]) for f in hostile.floods]
    _print_table(classes)
    flood_frames = {t.name: sum(c["frames"] for c in classes if c["target"] == t.name)
                    for t in targets}
    log_growth = {n: logs_after[n]["bytes"] - logs_before[n]["bytes"] for n in logs}
    holds = _holds_in_log(logs["server-1"])
    first_barred = next((line for line in server_lines
                         if giant_keys["giant"] in line.get("barred", [])), None)
    summary = {
        "frames_per_class_per_target": quota,
        "classes_short_of_quota": [f"{c['target']}/{c['class']}" for c in classes
                                   if c["frames"] < quota],
        "hostile_frames": sum(c["frames"] for c in classes),
        "hostile_messages": sum(c["messages"] for c in classes),
        "error_replies": sum(n for c in classes for k, n in c["replies"].items()
                             if k not in ("welcome", "params", "statusreply")),
        "answered": sum(c["answered"] for c in classes),
        "no_reply": sum(c["no_reply"] for c in classes),
        "unanswered_by_nodes": sum(c["unanswered_by_node"] or 0 for c in classes),
        "attack_seconds": round(attack_seconds, 1),
        "flood_seconds": round(seconds, 1),
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "honest_rounds_during_attack": [round_at_start, round_at_end],
        "honest_rounds_per_s_during_attack": round((round_at_end - round_at_start)
                                                   / max(attack_seconds, 1e-9), 2),
        "straggler": {"key": f"worker-{attackers.flood}", "target": server.name,
                      "hellos": straggler.hellos, "welcomes": straggler.welcomes},
        "idle_connections_held": held,
        "idle_connections_open_at_end": idle_open,
        "strangers": hostile.strangers,
        "crashes": len(crashes),
        "crashed": crashes,
        "server_counters": counters,
        "barred": barred,
        "giant": {name: {"key": key, **giants[name].report(key in barred["server-1"])}
                  for name, key in giant_keys.items()},
        "giant_first_barred_line": None if first_barred is None else {
            k: first_barred.get(k) for k in ("round", "closed", "missing", "barred")},
        "oversize": {n: {"key": f"worker-{attackers.oversize}",
                         **o.report(f"worker-{attackers.oversize}" in barred[n])}
                     for n, o in oversize.items()},
        "peak_rss_growth_mb": rss,
        "keyholders": keyholders,
        # what the in-flight guard's logged cuts at server-1 say a connection held (the
        # log is throttled: not every cut has its line)
        "holds_logged_at_server_1": holds,
        "log_bytes": {
            "during_attack": log_growth,
            "files_at_end": {n: logs_after[n]["files"] for n in logs},
            "flood_frames": flood_frames,
            "per_100k_hostile_frames": {n: round(log_growth[n] * 1e5 / max(1, flood_frames[n]))
                                        for n in logs},
        },
        "run_finished": isinstance(result, ClusterResult),
        "rounds_closed_short_replayed": replayed.rounds_closed_short if replayed else None,
        "bit_identical": bool(reference and result and reference.digest == result.digest),
    }
    return {"summary": summary, "classes": classes}


def _keyholder_phases(cfg: RunConfig, ring: KeyRing, endpoints: dict[str, str],
                      nodes: dict[str, int], out: Path, attackers: Attackers,
                      sampler: Sampler, options: dict, say: Callable[[str], None]) -> dict:
    """Phase 1b (``scripts/chaos_keyholders.py``): each key holders' attack of issue 35
    alone for ``--giant-seconds``, and what its node paid (CPU, log bytes, counters, peak
    RSS over its RSS when the phase began)."""
    seconds = options["giant_seconds"]
    ctx = zmq.Context()
    report: dict[str, dict] = {}
    began: dict[str, int] = {}

    def mark(phase: str, node: str) -> None:
        sampler.mark(phase)
        began[phase] = _status_kb(nodes[node], "VmRSS")

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
                              _hello(cfg, "worker", attackers.flood), attackers.flood,
                              lambda: _last_round(out / "server-1.jsonl"), stop)
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


def _await(run_dir: Path, names: list[str], run: BackgroundRun) -> dict[str, str]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and run.alive:
        files = {n: run_dir / f"{n}.endpoint" for n in names}
        if all(f.exists() for f in files.values()):
            return {n: f.read_text().strip() for n, f in files.items()}
        time.sleep(0.1)
    raise click.ClickException("the cluster did not come up")


def _await_round(metrics: Path, run: BackgroundRun) -> None:
    deadline = time.monotonic() + 300
    while _last_round(metrics) < 1:
        if time.monotonic() > deadline or not run.alive:
            raise click.ClickException("the cluster did not start training")
        time.sleep(0.1)


def _last_round(metrics: Path) -> int:
    """The round after the last one a metrics file records (its last 8 KB are read)."""
    try:
        with metrics.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(line)["round"] + 1
    return 0


def _log_bytes(path: Path) -> dict:
    """Bytes of a rotated log: the file and its backups (``.1``, ``.2``)."""
    files = [p for p in (path, *(path.with_name(f"{path.name}.{i}") for i in (1, 2, 3)))
             if p.exists()]
    return {"bytes": sum(p.stat().st_size for p in files), "files": [p.name for p in files]}


def _barred_in_log(path: Path) -> list[str]:
    """The keys a node's log says it barred (the proxy writes no metrics line with them)."""
    found = set()
    for p in (path.with_name(f"{path.name}.2"), path.with_name(f"{path.name}.1"), path):
        with contextlib.suppress(OSError):
            for line in p.read_text(errors="replace").splitlines():
                if "barred " in line and " for the rest of the run" in line:
                    found.add(line.split("barred ", 1)[1].split(" for the rest")[0])
    return sorted(found)


def _holds_in_log(path: Path) -> dict:
    """The bytes a cut connection held, as the node's log lines of its cuts say."""
    held = []
    for p in (path.with_name(f"{path.name}.2"), path.with_name(f"{path.name}.1"), path):
        with contextlib.suppress(OSError):
            held += [int(m.replace(",", "")) for m in
                     re.findall(r"held ([0-9,]+) bytes", p.read_text(errors="replace"))]
    return {"lines": len(held), "max_mb": round(max(held, default=0) / 2**20, 1),
            "median_mb": round(statistics.median(held) / 2**20, 1) if held else 0.0}


def _shard_sizes(cfg: RunConfig) -> list[int]:
    from common.data import dataset_spec
    from common.models import build_model, num_parameters
    from common.sharding import shard_ranges

    spec = dataset_spec(cfg.dataset)
    d = num_parameters(build_model(cfg.model, spec.input_shape, spec.num_classes, cfg.seed))
    return [stop - start for start, stop in shard_ranges(d, cfg.num_shards)]


def _print_table(classes: list[dict]) -> None:
    click.echo(f"{'target':9} {'class':20} {'frames':>9} {'messages':>8} {'answered':>8} "
               f"{'no reply':>8} {'dropped':>8}  replies")
    for c in classes:
        replies = ", ".join(f"{k} {n:,}" for k, n in sorted(c["replies"].items())) or "none"
        dropped = "?" if c["unanswered_by_node"] is None else f"{c['unanswered_by_node']:,}"
        click.echo(f"{c['target']:9} {c['class']:20} {c['frames']:>9,} {c['messages']:>8,} "
                   f"{c['answered']:>8,} {c['no_reply']:>8,} {dropped:>8}  {replies}")


# -- CPU of the worst accepted headers ------------------------------------------------

_PROBE = """
import json, sys
from common.config import RunConfig
from common.settings import SERVER, to_argv
cfg = RunConfig.from_settings(**json.loads(sys.argv[1])).validate()
print(json.dumps({"hash": cfg.config_hash, "config": cfg.to_dict(),
                  "argv": to_argv(cfg, SERVER)}, default=str))
"""


def _tree_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PS_")}
    return {**env, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _candidates(hello: dict, worker: int) -> dict[str, Frames]:
    """The most expensive headers a server still accepts or answers, and one just under
    64 KB with a 7,000-entry map (which a server before the header bounds compared with
    its settings in full; now refused as it decodes)."""
    valid = msgpack.packb({"v": PROTOCOL_VERSION, "op": int(Op.HELLO), "role": "worker",
                           "worker": worker, "config_hash": hello["hash"],
                           "config": hello["config"]})
    bogus = {f"bogus-setting-{i:02d}": [i, f"value-{i}" * 8] for i in range(64)}
    big = {f"s{i:04d}": i for i in range(7000)}  # a header just under 64 KB (the bound)
    return {
        "hello-valid-config": [valid],
        "status": _frames(Status()),
        "pull-current-round": _frames(Pull(round=0, worker=worker)),
        "hello-64-entry-bogus-config": [msgpack.packb(
            {"v": PROTOCOL_VERSION, "op": int(Op.HELLO), "role": "worker", "worker": worker,
             "config_hash": "0" * 16, "config": bogus})],
        "hello-7000-entry-config": [msgpack.packb(
            {"v": PROTOCOL_VERSION, "op": int(Op.HELLO), "role": "worker", "worker": worker,
             "config_hash": "0" * 16, "config": big})],
    }


def _flood_cpu(sock: zmq.Socket, pid: int, frames: Frames, count: int,
               sync: tuple[Frames, type], window: int | None) -> dict:
    """Send ``count`` messages as fast as the socket takes them, at most ``window``
    unanswered (for messages every one of which is answered: a ROUTER drops the replies
    a slow reader leaves it, sparing itself their cost; None for refusals, which may go
    unanswered: a window would pace the flood), then ``sync`` (a message and its reply's
    type), whose reply comes after every one of them; the server's CPU seconds and the
    wall seconds from the first message to that reply. (Should a reply be dropped, the
    window goes on after 1 s, the sync is sent again after 5 s.)"""
    out, (sync_frames, sync_reply) = [b"", *frames], sync
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    sent = answered = 0
    synced_at = last_reply = 0.0
    while True:
        while sock.poll(0):
            header = _reply_header(sock.recv_multipart())
            last_reply = time.monotonic()
            if synced_at and isinstance(header, sync_reply):
                return {"cpu_s": _cpu_s(pid) - cpu0, "wall_s": time.monotonic() - t0,
                        "answered": answered}
            answered += 1
        now = time.monotonic()
        if sent < count:
            if (window is not None and sent - answered >= window
                    and now - max(last_reply, t0) < 1.0):
                sock.poll(1)
                continue
            try:
                sock.send_multipart(out, flags=zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                sock.poll(5)
        elif not synced_at or now - max(synced_at, last_reply) > 5:
            if now - t0 > 600:
                raise click.ClickException("no reply to the sync after the CPU flood")
            sock.send_multipart([b"", *sync_frames])
            synced_at = now
        else:
            sock.poll(50)


def worst_headers(tree: Path, keys: Path, settings: dict, count: int, work: Path,
                  worker: int, repeats: int = 3) -> dict:
    """CPU-ms per 1,000 messages a standalone server (shard 1, from the code in ``tree``)
    spends on each candidate header from one key, over the same interval without them
    (median of ``repeats``); the worst candidate."""
    work.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(settings)], cwd=tree,
                           env=_tree_env(tree), capture_output=True, text=True, check=True)
    hello = json.loads(probe.stdout)
    ready = work / "server-1.endpoint"
    ready.unlink(missing_ok=True)
    log_path = work / "server-1.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "--shard", "1", "--bind", "tcp://127.0.0.1:*",
             "--ready-file", str(ready), "--out-dir", str(work), "--linger", "0",
             "--keys", str(keys), *hello["argv"]],
            cwd=tree, env=_tree_env(tree), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, os.getpid()))
    ctx = zmq.Context()
    ring = KeyRing(keys)
    click.echo(f"CPU of the worst accepted headers: server from {tree}", err=True)
    try:
        deadline = time.monotonic() + 600
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(f"the server from {tree} did not start: "
                                           f"{log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        endpoint = ready.read_text().strip()
        results = {}
        candidates = _candidates(hello, worker)
        valid = candidates["hello-valid-config"]
        # one connection for everything (a node admits a key's handshakes a few at a
        # time); its HELLO opens the session the PULLs need
        sock = connect_dealer(ctx, endpoint, 0, ring.client_curve(f"worker-{worker}", 1))
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.send_multipart([b"", *valid])
        if not sock.poll(30_000) or not isinstance(_reply_header(sock.recv_multipart()),
                                                   Welcome):
            raise click.ClickException(f"the server from {tree} did not WELCOME")
        for name, frames in candidates.items():
            # the sync: STATUS, or after STATUSes a HELLO (told apart by its reply)
            sync = (valid, Welcome) if name == "status" else (_frames(Status()), StatusReply)
            runs = []
            for _ in range(repeats):
                flood = _flood_cpu(sock, proc.pid, frames, count, sync,
                                   None if "bogus" in name or "7000" in name else 64)
                idle0 = _cpu_s(proc.pid)
                time.sleep(flood["wall_s"])  # the same interval without the flood
                idle = _cpu_s(proc.pid) - idle0
                runs.append({**flood, "idle_cpu_s": idle,
                             "ms_per_1000": (flood["cpu_s"] - idle) * 1e6 / count})
            best = statistics.median(r["ms_per_1000"] for r in runs)
            results[name] = {"cpu_ms_per_1000": round(best, 1),
                             "answered_of_sent": f"{runs[0]['answered']}/{count}",
                             "runs": [{k: round(v, 3) for k, v in r.items()} for r in runs]}
            click.echo(f"  {name:34} {best:8.1f} CPU-ms per 1,000", err=True)
        sock.close(linger=0)
        worst = max(results, key=lambda k: results[k]["cpu_ms_per_1000"])
        return {"tree": str(tree), "messages": count, "candidates": results,
                "worst_accepted": worst,
                "worst_accepted_cpu_ms_per_1000": results[worst]["cpu_ms_per_1000"]}
    finally:
        ctx.destroy(linger=0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _cpu_summary(cpu: dict) -> dict:
    """Per tree: the worst accepted candidate and its CPU-ms per 1,000; every candidate."""
    return {label: {"worst": r["worst_accepted"],
                    "cpu_ms_per_1000": r["worst_accepted_cpu_ms_per_1000"],
                    "all": {k: v["cpu_ms_per_1000"] for k, v in r["candidates"].items()}}
            for label, r in cpu.items()}


if __name__ == "__main__":
    main()
