"""``ps-proxy``: a man-in-the-middle between the workers and one server.

A ROUTER socket binds where the workers expect the server; a DEALER connects
to the real server. Requests travel front -> back with the worker's identity
prepended (the server treats that envelope as opaque and echoes it), replies
travel back -> front routed by that identity. On the way, PUSH payloads (and,
with ``corrupt_params``, PARAMS replies) are corrupted by a ``ShardCorruptor``.
Anything the proxy cannot decode is relayed unchanged: judging it is the
server's job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from common.config import AttackConfig, RunConfig
from common.errors import ClusterTimeout, ConfigError
from common.metrics import JsonlWriter
from common.protocol import (
    Ack,
    Hello,
    Message,
    Params,
    ProtocolError,
    Pull,
    Push,
    Welcome,
    decode,
    encode,
    split_envelope,
)
from common.sockets import configure, write_ready_file
from ps.corruption import ShardCorruptor

log = logging.getLogger("ps.proxy")

POLL_MS = 200
HANDSHAKE_RETRY_S = 1.0


@dataclass
class _RoundTally:
    pushes: int = 0
    corrupted: int = 0


@dataclass
class _HeldPush:
    envelope: list[Any]
    header: Push
    values: np.ndarray


@dataclass
class ProxyOptions:
    """Where the proxy listens and which server it fronts."""

    bind: str
    server: str
    out_dir: Path | None = None
    ready_file: Path | None = None
    connect_timeout_s: float = 120.0


@dataclass
class _State:
    tallies: dict[int, _RoundTally] = field(default_factory=lambda: defaultdict(_RoundTally))
    held: dict[int, dict[int, _HeldPush]] = field(default_factory=lambda: defaultdict(dict))
    puller: dict[bytes, int] = field(default_factory=dict)
    relayed_unparsed: int = 0
    final_acks: int = 0


class Proxy:
    """Relay loop with in-flight corruption for one shard."""

    def __init__(self, cfg: RunConfig, attack: AttackConfig, options: ProxyOptions) -> None:
        self.cfg = cfg
        self.attack = attack
        self.options = options
        self.ctx = zmq.Context.instance()
        self.state = _State()
        self.stop_event = threading.Event()
        self.corruptor: ShardCorruptor | None = None
        self.metrics: JsonlWriter | None = None
        self.endpoint = ""

    def request_stop(self, *_: Any) -> None:
        self.stop_event.set()

    def run(self) -> None:
        back = configure(self.ctx.socket(zmq.DEALER), linger_ms=1000)
        back.connect(self.options.server)
        front = configure(self.ctx.socket(zmq.ROUTER), linger_ms=1000)
        try:
            welcome = self._handshake(back)
            self.corruptor = ShardCorruptor(
                self.cfg, self.attack, welcome.shard, welcome.start, welcome.stop
            )
            out = self.options.out_dir
            self.metrics = JsonlWriter(out / f"proxy-{welcome.shard}.jsonl" if out else None)
            try:
                front.bind(self.options.bind)
            except zmq.ZMQError as exc:
                raise ConfigError(f"cannot bind {self.options.bind}: {exc}") from exc
            self.endpoint = front.getsockopt_string(zmq.LAST_ENDPOINT)
            log.info(
                "fronting shard %d [%d, %d) at %s -> %s with attack %s",
                welcome.shard, welcome.start, welcome.stop, self.endpoint,
                self.options.server, self.attack.proxy_attack,
            )
            write_ready_file(self.options.ready_file, self.endpoint)
            self._relay(front, back)
        finally:
            front.close(linger=1000)
            back.close(linger=1000)
            if self.metrics:
                self.metrics.close()

    # -- startup -----------------------------------------------------------------

    def _handshake(self, back: zmq.Socket) -> Welcome:
        """HELLO the server (as role 'proxy') until it answers; learn the shard's range."""
        hello = Hello(role="proxy", worker=-1, config_hash=self.cfg.config_hash,
                      config=self.cfg.to_dict())
        deadline = time.monotonic() + self.options.connect_timeout_s
        while not self.stop_event.is_set():
            back.send_multipart([b"", *encode(hello)])
            if back.poll(int(HANDSHAKE_RETRY_S * 1000), zmq.POLLIN):
                frames = back.recv_multipart()
                try:
                    _, body = split_envelope(frames)
                    header = decode(body).header
                except ProtocolError as exc:
                    raise ConfigError(
                        f"server {self.options.server} answered garbage: {exc}"
                    ) from exc
                if isinstance(header, Welcome):
                    return header
                raise ConfigError(f"server {self.options.server} refused the proxy: {header}")
            if time.monotonic() > deadline:
                raise ClusterTimeout(
                    f"server {self.options.server} did not answer within "
                    f"{self.options.connect_timeout_s:g} s"
                )
        raise KeyboardInterrupt

    # -- relay -------------------------------------------------------------------

    def _relay(self, front: zmq.Socket, back: zmq.Socket) -> None:
        """Relay until stopped, or until the n ACKs of the last round went back."""
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        while not self.stop_event.is_set():
            if self.state.final_acks >= self.cfg.num_workers:
                log.info("the last round's pushes were all acknowledged; exiting")
                return
            events = dict(poller.poll(POLL_MS))
            if front in events:
                self._from_worker(front, back, front.recv_multipart(copy=False))
            if back in events:
                frames = back.recv_multipart(copy=False)
                if frames and len(frames[0]) == 0:
                    continue  # late reply to our own HELLO
                self._from_server(front, frames)

    def _from_worker(self, front: zmq.Socket, back: zmq.Socket, frames: list) -> None:
        try:
            envelope, body = split_envelope(frames)
            msg = decode(body)
        except ProtocolError:
            self.state.relayed_unparsed += 1
            back.send_multipart(frames, copy=False)
            return
        header = msg.header
        if isinstance(header, Pull):
            self.state.puller[bytes(envelope[-1])] = header.worker
        if isinstance(header, Push):
            self._on_push(back, envelope, msg)
            return
        back.send_multipart(frames, copy=False)

    def _on_push(self, back: zmq.Socket, envelope: list[Any], msg: Message) -> None:
        push: Push = msg.header  # type: ignore[assignment]
        if push.pull_next:  # the reply will be PARAMS for this worker
            self.state.puller[bytes(envelope[-1])] = push.worker
        corruptor = self.corruptor
        if corruptor.whole_round and 0 <= push.worker < self.cfg.num_workers:
            held = self.state.held[push.round]
            held[push.worker] = _HeldPush(envelope, push, np.array(msg.tensor()))
            if len(held) == self.cfg.num_workers:
                self._release_round(back, push.round)
            return
        values, changed = corruptor.corrupt_push(push.round, push.worker, msg.tensor())
        self._tally(push.round, changed)
        back.send_multipart([*envelope, b"", *encode(push, values)], copy=False)

    def _release_round(self, back: zmq.Socket, round_: int) -> None:
        held = self.state.held.pop(round_)
        ordered = [held[i] for i in range(self.cfg.num_workers)]
        values, changed = self.corruptor.corrupt_round(round_, [h.values for h in ordered])
        for h, v in zip(ordered, values, strict=True):
            back.send_multipart([*h.envelope, b"", *encode(h.header, v)], copy=False)
        self._tally(round_, changed, pushes=len(ordered))
        for old in [r for r in self.state.held if r < round_]:
            self.state.held.pop(old)  # pushes of a round that can no longer complete

    def _from_server(self, front: zmq.Socket, frames: list) -> None:
        try:
            envelope, body = split_envelope(frames)
            msg = decode(body)
        except ProtocolError:
            front.send_multipart(frames, copy=False)
            return
        header = msg.header
        if isinstance(header, Ack) and header.round == self.cfg.rounds - 1:
            self.state.final_acks += 1
        if isinstance(header, Params) and self.attack.corrupt_params:
            worker = self.state.puller.get(bytes(envelope[-1]), -1)
            values, changed = self.corruptor.corrupt_params(header.round, worker, msg.tensor())
            if changed:
                self.metrics.write({"time": time.time(), "round": header.round,
                                    "worker": worker, "params_corrupted": changed})
            front.send_multipart([*envelope, b"", *encode(header, values)], copy=False)
            return
        front.send_multipart(frames, copy=False)

    # -- metrics -----------------------------------------------------------------

    def _tally(self, round_: int, changed: int, pushes: int = 1) -> None:
        """Count a round's relayed pushes; write its line once all n went through."""
        tally = self.state.tallies[round_]
        tally.pushes += pushes
        tally.corrupted += changed
        if tally.pushes >= self.cfg.num_workers:
            self.metrics.write({"time": time.time(), "round": round_, "pushes": tally.pushes,
                                "corrupted_values": tally.corrupted,
                                "unparsed_relayed": self.state.relayed_unparsed})
            del self.state.tallies[round_]
