"""The hostile classes of the chaos run and the frames they send: the targets (a node under
attack, its shard and the shard's size), the worker ids whose keys the attackers hold, a
class's message builder and how it speaks (after a HELLO, with its own envelope, within a
window), the flood classes of the issue's table that reach a node behind the handshake,
the oversize and 2 GB messages of the offenders, and how a reply is read back.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from common.net.keys import CurveClient, KeyRing
from common.net.protocol import (
    PROTOCOL_VERSION,
    Hello,
    Op,
    ProtocolError,
    Pull,
    Push,
    Status,
    decode,
    encode,
)
from common.net.transport import largest_message
from common.run.config import RunConfig

Frames = list[bytes]

GIANT_FRAME_BYTES = 4 << 20
GIANT_FRAMES = 512  # 2 GB
BYZANTINE_KEYS = 4  # flood, oversize, giant, giant-silent


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


def raw_header(body: dict) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, **body})


def frames_of(header, tensor: np.ndarray | None = None) -> Frames:
    return [bytes(f) for f in encode(header, tensor)]


@functools.lru_cache(maxsize=4096)
def push_frames(target: Target, round_: int, worker: int, size: int | None = None) -> Frames:
    values = np.zeros(target.shard_size if size is None else size, dtype=np.float32)
    return frames_of(Push(round=round_, worker=worker, length=values.size), values)


def hello_message(cfg: RunConfig, role: str, worker: int) -> Hello:
    return Hello(role=role, worker=worker, config_hash=cfg.config_hash, config=cfg.to_dict())


def oversize_message(target: Target, worker: int) -> Frames:
    """A push whose frames add up to more than the largest legal message (16 KiB each)."""
    chunk = b"\x00" * 16384
    count = largest_message(target.shard_size) // len(chunk) + 2
    header = raw_header({"op": int(Op.PUSH), "round": 0, "worker": worker,
                      "length": count * len(chunk) // 4})
    return [b"", header, *[chunk] * count]


@functools.cache
def _giant_chunk() -> bytes:
    return bytes(GIANT_FRAME_BYTES)


def giant_message() -> Frames:
    """A 2 GB message: the same 4 MiB buffer 512 times (sent with copy=False)."""
    return [b"", *[_giant_chunk()] * GIANT_FRAMES]


def hostile_classes(cfg: RunConfig) -> list[HostileClass]:
    """The flood classes of the issue's table that reach a node behind the handshake."""
    status = frames_of(Status())
    bad_config: dict[Any, Any] = {**cfg.to_dict(), b"lr": 9.0, "rule": [1, {2: 3}]}
    beyond = cfg.rounds + 1  # a round no run of these settings ever reaches
    monitor = hello_message(cfg, "monitor", -1)
    worker, reader = "worker", "evaluator"
    return [
        HostileClass("garbage", worker, lambda t, c, i, r, w: [b"\xc1" + os.urandom(16)]),
        HostileClass("bad-version", worker, lambda t, c, i, r, w: [
            raw_header({"v": PROTOCOL_VERSION + 9, "op": int(Op.STATUS)})]),
        HostileClass("unknown-op", worker, lambda t, c, i, r, w: [raw_header({"op": 77})]),
        HostileClass("truncated-tensor", worker, lambda t, c, i, r, w: [raw_header(
            {"op": int(Op.PUSH), "round": 0, "worker": w, "length": t.shard_size}),
            b"\0" * 8]),
        HostileClass("no-hello", worker, lambda t, c, i, r, w: frames_of(Pull(round=0, worker=w))),
        # pushes as the honest workers 0..2 with the attacker's own key
        HostileClass("impersonation", worker, lambda t, c, i, r, w: push_frames(t, 0, i % 3)),
        HostileClass("bad-config-hello", worker, lambda t, c, i, r, w: [msgpack.packb(
            {"v": PROTOCOL_VERSION, "op": int(Op.HELLO), "role": "worker", "worker": w,
             "config_hash": "0" * 16, "config": bad_config})]),
        HostileClass("no-delimiter", worker, lambda t, c, i, r, w: [b"\x01" * 5], raw=True),
        # with a session: said HELLO first, as the worker whose key they hold
        HostileClass("bad-worker-or-round", worker,
                     lambda t, c, i, r, w: (push_frames(t, 0, -1) if i % 2
                                            else push_frames(t, -1, w)),
                     hello=True),
        HostileClass("wrong-length", worker, lambda t, c, i, r, w: push_frames(t, r, w, 1 + i % 7),
                     hello=True, window=16),
        HostileClass("future-rounds", worker,
                     lambda t, c, i, r, w: push_frames(t, beyond + i % 600, w), hello=True),
        HostileClass("pull-flood", worker, lambda t, c, i, r, w: frames_of(
            Pull(round=min(r + 200 + i % 3, c.rounds), worker=w)), hello=True),
        # forged envelopes with the evaluator's key
        HostileClass("hello-flood", reader,
                     lambda t, c, i, r, w: [os.urandom(5), b"", *frames_of(monitor)], raw=True),
        HostileClass("large-routing-ids", reader,
                     lambda t, c, i, r, w: [b"r" * 100_000, b"", *status], raw=True),
        HostileClass("deep-envelope", reader, lambda t, c, i, r, w: [
            *[os.urandom(5) for _ in range(8)], b"", *status], raw=True),
    ]


def reply_header(frames: list[bytes]):
    """The header of a reply a DEALER received (None: undecodable)."""
    body = frames[frames.index(b"") + 1:] if b"" in frames else frames
    try:
        return decode(body).header
    except ProtocolError:
        return None
