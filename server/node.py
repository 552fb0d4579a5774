"""The server node: a ZeroMQ ROUTER loop around one ``ShardState``.

Answers HELLO, PULL, PUSH and STATUS (see ``docs/protocol.md``). Every
malformed or refused request gets an ERROR reply and a counter; nothing a
peer sends can stop the loop. A PULL for a round that does not exist yet is
parked and answered when the round completes.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from common.config import RunConfig
from common.errors import ConfigError
from common.metrics import JsonlWriter
from common.protocol import (
    Ack,
    Error,
    ErrorCode,
    Hello,
    Message,
    Params,
    ProtocolError,
    Pull,
    Push,
    Status,
    StatusReply,
    Welcome,
    decode,
    encode,
    join_envelope,
    split_envelope,
)
from common.sharding import shard_ranges
from common.sockets import configure, write_ready_file
from server.checkpoint import Checkpoint, checkpoint_path, load_checkpoint, save_checkpoint
from server.shard import Refused, ShardState

log = logging.getLogger("ps.server")

POLL_MS = 200
# PULLs parked for future rounds; more than this is refused (a peer cannot grow memory).
MAX_PARKED = 4096
ROLES = ("worker", "evaluator", "proxy", "monitor")


@dataclass
class ServerOptions:
    """How one server node runs (everything but the shared run configuration)."""

    shard: int
    bind: str
    out_dir: Path | None = None
    ready_file: Path | None = None
    linger_s: float = 30.0
    checkpoint_every: int = 1
    resume: bool = False


@dataclass
class _Parked:
    envelope: list[Any]
    round: int


class ServerNode:
    """One shard's server process: owns the socket, the shard state and the metrics."""

    def __init__(self, cfg: RunConfig, options: ServerOptions, initial: np.ndarray) -> None:
        start, stop = shard_ranges(initial.size, cfg.num_shards)[options.shard]
        self.cfg = cfg
        self.options = options
        self.start, self.stop, self.d = start, stop, initial.size
        self.state = ShardState(cfg, options.shard, initial[start:stop])
        if options.resume:
            self._resume()
        self.parked: list[_Parked] = []
        self.bytes_in = 0
        self.evaluators_waiting: set[bytes] = set()
        self.stop_event = threading.Event()
        out = options.out_dir
        self.metrics = JsonlWriter(out / f"server-{options.shard}.jsonl" if out else None)
        self.endpoint = ""

    # -- lifecycle ---------------------------------------------------------------

    def run(self) -> None:
        """Serve until the last round is done (plus linger) or a stop is requested."""
        ctx = zmq.Context.instance()
        sock = configure(ctx.socket(zmq.ROUTER), linger_ms=1000)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            try:
                sock.bind(self.options.bind)
            except zmq.ZMQError as exc:
                raise ConfigError(f"cannot bind {self.options.bind}: {exc}") from exc
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            log.info(
                "shard %d/%d [%d, %d) of d=%d listening on %s (rule %s, n=%d, q=%d, %d rounds)",
                self.state.shard, self.cfg.num_shards, self.start, self.stop, self.d,
                self.endpoint, self.cfg.rule, self.cfg.num_workers, self.cfg.q, self.cfg.rounds,
            )
            write_ready_file(self.options.ready_file, self.endpoint)
            self._serve(sock)
        finally:
            self._save_checkpoint()
            sock.close(linger=1000)
            self.metrics.close()

    def request_stop(self, *_: Any) -> None:
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def _serve(self, sock: zmq.Socket) -> None:
        finished_at: float | None = None
        while not self.stop_event.is_set():
            if self.state.finished:
                finished_at = finished_at or time.monotonic()
                lingering = time.monotonic() - finished_at < self.options.linger_s
                # linger only for an evaluator that has not read the final round
                if not lingering or not self.evaluators_waiting:
                    log.info("run finished after %d rounds; exiting", self.cfg.rounds)
                    return
            if sock.poll(POLL_MS, zmq.POLLIN):
                # drain what is queued before checking the clock again
                while sock.poll(0, zmq.POLLIN):
                    self._handle(sock, sock.recv_multipart(copy=False))

    # -- requests ----------------------------------------------------------------

    def _handle(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        self.bytes_in += sum(len(f) for f in frames)
        try:
            envelope, body = split_envelope(frames)
        except ProtocolError as exc:
            # without a delimiter the reply route is unknown (the first frame is the
            # peer's identity, so reply there if present)
            self._count("malformed")
            log.warning("malformed message (%s)", exc)
            if frames:
                self._send(sock, [frames[0]], Error(ErrorCode.MALFORMED.value, str(exc)))
            return
        try:
            msg = decode(body)
        except ProtocolError as exc:
            self._count("malformed")
            log.warning("malformed message: %s", exc)
            self._send(sock, envelope, self._error(ErrorCode.MALFORMED, str(exc)))
            return
        header = msg.header
        try:
            if isinstance(header, Hello):
                self._on_hello(sock, envelope, header)
            elif isinstance(header, Pull):
                self._on_pull(sock, envelope, header)
            elif isinstance(header, Push):
                self._on_push(sock, envelope, msg)
            elif isinstance(header, Status):
                self._send(sock, envelope, self._status())
            else:
                raise Refused(ErrorCode.UNEXPECTED, f"a server does not accept {header.op.name}")
        except Refused as exc:
            self._count(exc.code.value)
            log.debug("refused %s: %s", type(header).__name__, exc)
            self._send(sock, envelope, self._error(exc.code, str(exc)))

    def _on_hello(self, sock: zmq.Socket, envelope: list[Any], hello: Hello) -> None:
        if hello.role not in ROLES:
            raise Refused(ErrorCode.MALFORMED, f"unknown role {hello.role!r}")
        if hello.config_hash != self.cfg.config_hash:
            diffs = self.cfg.differences(hello.config) if hello.config else []
            detail = "; ".join(diffs) if diffs else "no settings sent to compare"
            raise Refused(
                ErrorCode.CONFIG_MISMATCH,
                f"configuration hash {hello.config_hash} != server's {self.cfg.config_hash} "
                f"(server vs peer: {detail})",
            )
        if hello.role == "worker" and not 0 <= hello.worker < self.cfg.num_workers:
            raise Refused(
                ErrorCode.UNKNOWN_WORKER,
                f"worker {hello.worker} is not in 0..{self.cfg.num_workers - 1}",
            )
        if hello.role == "evaluator":
            self.evaluators_waiting.add(bytes(envelope[-1]))
        log.info("hello from %s %d", hello.role, hello.worker)
        self._send(
            sock,
            envelope,
            Welcome(
                shard=self.state.shard,
                num_shards=self.cfg.num_shards,
                start=self.start,
                stop=self.stop,
                d=self.d,
                round=self.state.round,
                rounds=self.cfg.rounds,
            ),
        )

    def _on_pull(self, sock: zmq.Socket, envelope: list[Any], pull: Pull) -> None:
        params = self.state.params_at(pull.round)
        if params is None:
            if len(self.parked) >= MAX_PARKED:
                raise Refused(ErrorCode.UNEXPECTED, f"too many parked PULLs ({MAX_PARKED})")
            self.parked.append(_Parked(envelope, pull.round))
            return
        self._send_params(sock, envelope, pull.round, params)

    def _on_push(self, sock: zmq.Socket, envelope: list[Any], msg: Message) -> None:
        push: Push = msg.header  # type: ignore[assignment]
        row = self.state.check_push(push.round, push.worker, push.length)
        msg.tensor_into(row)
        self.state.mark_received(push.worker)
        if push.pull_next:
            self.parked.append(_Parked(envelope, push.round + 1))  # answered by PARAMS
        else:
            self._send(sock, envelope, Ack(round=push.round, worker=push.worker))
        if self.state.complete:
            self._finish_round(sock)

    def _finish_round(self, sock: zmq.Socket) -> None:
        m = self.state.step()
        self.metrics.write(
            {
                "time": time.time(),
                "shard": self.state.shard,
                "round": m.round,
                "aggregation_ms": round(m.aggregation_ms, 3),
                "nonfinite_values": m.nonfinite_values,
                "params_finite": m.params_finite,
                "bytes_in": self.bytes_in,
                "errors": sum(self.state.counters.values()),
                "rule_info": m.rule_info,
            }
        )
        every = self.options.checkpoint_every
        if every and self.state.round % every == 0:
            self._save_checkpoint()
        if m.round % 50 == 0 or self.state.finished:
            log.info("round %d aggregated in %.2f ms", m.round, m.aggregation_ms)
        waiting, self.parked = self.parked, []
        for p in waiting:
            if p.round == self.state.round:
                self._send_params(sock, p.envelope, p.round, self.state.params)
            else:
                self.parked.append(p)

    def _send_params(self, sock: zmq.Socket, envelope: list[Any], round_: int, params: np.ndarray):
        header = Params(round=round_, shard=self.state.shard, length=params.size)
        self._send(sock, envelope, header, params)
        if round_ >= self.cfg.rounds:
            self.evaluators_waiting.discard(bytes(envelope[-1]))

    # -- helpers -----------------------------------------------------------------

    def _status(self) -> StatusReply:
        return StatusReply(
            shard=self.state.shard,
            round=self.state.round,
            rounds=self.cfg.rounds,
            finished=self.state.finished,
            pushes=np.flatnonzero(self.state.received).tolist(),
            counters=dict(self.state.counters),
        )

    def _error(self, code: ErrorCode, message: str) -> Error:
        return Error(code=code.value, message=message, round=self.state.round)

    def _count(self, what: str) -> None:
        self.state.counters[what] += 1

    @staticmethod
    def _send(sock: zmq.Socket, envelope: list[Any], header, tensor: np.ndarray | None = None):
        sock.send_multipart(join_envelope(envelope, encode(header, tensor)), copy=False)

    def _save_checkpoint(self) -> None:
        """Write the shard's parameters and round (atomically) to ``shard-<s>.npz``."""
        if self.options.out_dir is None:
            return
        path = checkpoint_path(self.options.out_dir, self.state.shard)
        save_checkpoint(path, Checkpoint(self.state.shard, self.state.round,
                                         self.cfg.config_hash, self.state.params))

    def _resume(self) -> None:
        """Continue from the checkpoint in ``out_dir`` if there is one."""
        if self.options.out_dir is None:
            raise ConfigError("--resume needs --out-dir (where the checkpoint is)")
        path = checkpoint_path(self.options.out_dir, self.state.shard)
        if not path.exists():
            log.info("no checkpoint at %s; starting from round 0", path)
            return
        ckpt = load_checkpoint(path)
        if ckpt.config_hash != self.cfg.config_hash or ckpt.shard != self.state.shard:
            raise ConfigError(
                f"checkpoint {path} is of shard {ckpt.shard} with configuration "
                f"{ckpt.config_hash}, not shard {self.state.shard} with {self.cfg.config_hash}"
            )
        if ckpt.params.size != self.state.size:
            raise ConfigError(f"checkpoint {path} holds {ckpt.params.size} values, "
                              f"shard has {self.state.size}")
        self.state.restore(ckpt.round, ckpt.params)
        log.info("resumed from %s at round %d", path, ckpt.round)
