"""One hostile class at one target and the attackers that run beside the floods:
:class:`Flood` (HELLO if the class says one, STATUS, the flood, STATUS: what came back in
between is the class's), :class:`Lane` (a target's classes one after another on one
connection per key), :class:`Offender` (a hard limit broken again and again from one key,
each time on a new connection whose handshakes a monitor counts) and :class:`Straggler`
(a Byzantine worker that says HELLO and never pushes, so that every round waits for its
deadline).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import recv_monitor_message

from common.net.keys import CurveClient, KeyRing
from common.net.protocol import Ack, Error, Hello, Status, StatusReply, Welcome
from common.net.transport import configure, connect_dealer
from common.run.config import RunConfig
from ps.chaos.classes import (
    Frames,
    HostileClass,
    Target,
    frames_of,
    hello_message,
    reply_header,
)

HELLO_WAIT_S = 10.0  # a class's HELLO and first STATUS
SYNC_WAIT_S = 60.0  # a class's last STATUS, behind everything it sent
OFFENDER_HOLD_S = 5.0  # how long an offender's connection waits to be cut
OFFENDER_PAUSE_S = 0.05  # before it reconnects
SENT_PER_STEP = 64
STALL_S = 30.0  # a class that can send nothing and gets nothing back this long ends

_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
           | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
           | zmq.EVENT_DISCONNECTED)
_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


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
            self._say([b"", *frames_of(hello_message(self.cfg, "worker", self.worker))],
                      "hello", now)
        else:
            self._say([b"", *frames_of(Status())], "before", now)

    @property
    def connection(self) -> zmq.Socket:
        """The socket :meth:`open` started on (before any :meth:`step`)."""
        if self.sock is None:
            raise RuntimeError("a flood steps once opened")
        return self.sock

    def step(self, now: float) -> bool:
        """Read what came back, send some more; whether the class is still going."""
        while self.state != "done":
            try:
                frames = self.connection.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            self._take(reply_header(frames), now)
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
                self._say([b"", *frames_of(Status())], "before", now)
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
        if self.outbox is None:
            raise RuntimeError("nothing waits to be sent")
        with contextlib.suppress(zmq.Again):
            self.connection.send_multipart(self.outbox, flags=zmq.NOBLOCK)
            self.outbox = None

    def _take(self, header, now: float) -> None:
        if self.state == "hello":  # the answer to the class's HELLO
            self.hello_reply = header.code if isinstance(header, Error) else (
                type(header).__name__.lower() if header is not None else "undecodable")
            self._say([b"", *frames_of(Status())], "before", now)
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
                self._say([b"", *frames_of(Status())], "sync", now)
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
                self.connection.send_multipart(out, flags=zmq.NOBLOCK, copy=False)
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
                    sock.send_multipart([b"", *frames_of(Status())])
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
            or self.started_at is None  # (set before any offence)
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
        self.target, self.curve, self.hello = target, curve, [b"", *frames_of(hello)]
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
                    self.welcomes += isinstance(reply_header(sock.recv_multipart()), Welcome)
        finally:
            ctx.destroy(linger=0)
