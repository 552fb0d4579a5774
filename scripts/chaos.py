"""Chaos: an honest cluster with CURVE keys trains while hostile peers send at least
``--frames`` frames of every hostile class at one server and at one proxy.

It prints, per target and class, the frames and messages sent and the replies that came
back (by ERROR code); the crashes (node processes that died or exited non-zero: must be
0); the peak RSS growth of every server and proxy during the attack; and whether the run
still ended with parameters bit-identical to the in-process reference engine.

    python3 scripts/chaos.py                    # 100,000 frames of each class per target
    python3 scripts/chaos.py --frames 2000      # a quick look

The hostile peers are insiders: they hold keys of the run (worker 0..3's and the
evaluator's, as a thief of those keys would), so their messages reach every check
behind the CURVE handshake, and they never send a message a server could accept as an
honest push (that would be a Byzantine worker, which the rules are there for). Besides
the classes, strangers without an admitted key try to connect, and idle TCP connections
are held open for the whole attack.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
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
    decode,
    encode,
)
from common.transport import connect_dealer, largest_message
from ps.launcher.cluster import Cluster, ClusterResult, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.reference.engine import simulate
from server.options import ServerOptions

Frames = list[bytes]


@dataclass(frozen=True)
class Target:
    """A node under attack: its endpoint, the key it presents, its shard's size."""

    name: str
    endpoint: str
    shard: int
    shard_size: int


@dataclass(frozen=True)
class HostileClass:
    """A kind of hostile message: who sends it, whether it says HELLO first, what it is."""

    name: str
    key: str  # the stolen key it uses
    # (target, cfg, i, the target's round as its last ERROR said) -> the i-th message
    message: Callable[[Target, RunConfig, int, int], Frames]
    hello: Hello | None = None  # said once on the connection before the flood
    raw: bool = False  # the frames carry their own (forged or missing) envelope
    window: int | None = None  # at most this many unanswered (to track the round)


def _header(body: dict) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, **body})


def _frames(header, tensor: np.ndarray | None = None) -> Frames:
    return [bytes(f) for f in encode(header, tensor)]


def _push(target: Target, round_: int, worker: int, size: int | None = None) -> Frames:
    values = np.zeros(target.shard_size if size is None else size, dtype=np.float32)
    return _frames(Push(round=round_, worker=worker, length=values.size), values)


def _oversize(target: Target, cfg: RunConfig, i: int, now: int) -> Frames:
    """A push whose frames add up to more than the largest legal message (16 KiB each)."""
    chunk = b"\x00" * 16384
    count = largest_message(target.shard_size) // len(chunk) + 2
    header = _header({"op": int(Op.PUSH), "round": 0, "worker": 0,
                      "length": count * len(chunk) // 4})
    return [header, *[chunk] * count]


def _hello(cfg: RunConfig, role: str, worker: int) -> Hello:
    return Hello(role=role, worker=worker, config_hash=cfg.config_hash, config=cfg.to_dict())


def hostile_classes(cfg: RunConfig) -> list[HostileClass]:
    """Every class of the issue's table that reaches a node behind the handshake.

    Each builder takes (target, cfg, i, r): the i-th message, r the target's round as
    its last ERROR said.
    """
    status = _frames(Status())
    bad_config = {**cfg.to_dict(), b"lr": 9.0, "rule": [1, {2: 3}]}
    beyond = cfg.rounds + 1  # a round no run of these settings ever reaches
    monitor = _hello(cfg, "monitor", -1)
    as_worker = [_hello(cfg, "worker", k) for k in range(4)]
    classes = [
        ("garbage", "worker-0", lambda t, c, i, r: [b"\xc1" + os.urandom(16)]),
        ("bad-version", "worker-0",
         lambda t, c, i, r: [_header({"v": PROTOCOL_VERSION + 9, "op": int(Op.STATUS)})]),
        ("unknown-op", "worker-0", lambda t, c, i, r: [_header({"op": 77})]),
        ("truncated-tensor", "worker-0", lambda t, c, i, r: [_header(
            {"op": int(Op.PUSH), "round": 0, "worker": 0, "length": t.shard_size}), b"\0" * 8]),
        ("no-hello", "worker-0", lambda t, c, i, r: _frames(Pull(round=0, worker=0))),
        ("impersonation", "worker-0", lambda t, c, i, r: _push(t, 0, 1 + i % 3)),
        ("bad-config-hello", "worker-0", lambda t, c, i, r: [msgpack.packb(
            {"v": PROTOCOL_VERSION, "op": int(Op.HELLO), "role": "worker", "worker": 0,
             "config_hash": "0" * 16, "config": bad_config})]),
        ("oversize", "worker-0", _oversize),
    ]
    with_session = [  # said HELLO first, as the worker whose key they hold
        ("bad-worker-or-round", "worker-1",
         lambda t, c, i, r: _push(t, 0, -1) if i % 2 else _push(t, -1, 1), as_worker[1]),
        ("wrong-length", "worker-2", lambda t, c, i, r: _push(t, r, 2, 1 + i % 7), as_worker[2],
         16),
        ("future-rounds", "worker-3", lambda t, c, i, r: _push(t, beyond + i % 600, 3),
         as_worker[3]),
        ("pull-flood", "worker-0",
         lambda t, c, i, r: _frames(Pull(round=min(r + 200 + i % 3, c.rounds), worker=0)),
         as_worker[0]),
    ]
    forged_envelopes = [
        ("no-delimiter", "worker-0", lambda t, c, i, r: [b"\x01" * 5]),
        ("hello-flood", "evaluator", lambda t, c, i, r: [os.urandom(5), b"", *_frames(monitor)]),
        ("large-routing-ids", "evaluator", lambda t, c, i, r: [b"r" * 100_000, b"", *status]),
        ("deep-envelope", "evaluator",
         lambda t, c, i, r: [*[os.urandom(5) for _ in range(8)], b"", *status]),
    ]
    return ([HostileClass(*c) for c in classes]
            + [HostileClass(*c[:3], hello=c[3], window=c[4] if len(c) > 4 else None)
               for c in with_session]
            + [HostileClass(*c, raw=True) for c in forged_envelopes])


@dataclass
class Flood:
    """One connection sending one class at one target, with what came back."""

    target: Target
    kind: HostileClass
    sock: zmq.Socket
    messages: int = 0
    frames: int = 0
    round: int = 0  # the target's current round, as its last reply said
    unanswered: int = 0  # messages sent that no reply answered yet
    replies: Counter[str] = field(default_factory=Counter)

    def send_some(self, cfg: RunConfig, quota: int, batch: int = 64) -> None:
        """Up to ``batch`` messages, as many as the socket takes without blocking."""
        for _ in range(batch):
            window = self.kind.window
            if self.frames >= quota or (window is not None and self.unanswered >= window):
                return
            frames = self.kind.message(self.target, cfg, self.messages, self.round)
            out = frames if self.kind.raw else [b"", *frames]
            try:
                self.sock.send_multipart(out, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.messages += 1
            self.frames += len(out)
            self.unanswered += 1

    def drain(self) -> None:
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.unanswered = max(0, self.unanswered - 1)
            body = frames[frames.index(b"") + 1:] if b"" in frames else frames
            try:
                header = decode(body).header
            except ProtocolError:
                self.replies["undecodable"] += 1
                continue
            if isinstance(header, Error):
                self.round = max(self.round, header.round)
                self.replies[header.code] += 1
            else:
                if isinstance(header, Ack):  # a repeat: that round was pushed already
                    self.round = max(self.round, header.round + 1)
                self.replies[type(header).__name__.lower()] += 1


def _ask(sock: zmq.Socket, frames: Frames, timeout_ms: int = 10_000):
    sock.send_multipart([b"", *frames])
    if not sock.poll(timeout_ms):
        raise click.ClickException("a target did not answer within 10 s")
    return decode(sock.recv_multipart()[1:]).header


class Attack:
    """The hostile peers of one run, their connections, and the strangers' attempts."""

    def __init__(self, cfg: RunConfig, ring: KeyRing, targets: list[Target], quota: int):
        self.cfg, self.ring, self.targets, self.quota = cfg, ring, targets, quota
        self.ctx = zmq.Context()
        self.floods: list[Flood] = []
        for target in targets:
            for kind in hostile_classes(cfg):
                sock = connect_dealer(self.ctx, target.endpoint, 0,
                                      ring.client_curve(kind.key, target.shard))
                sock.setsockopt(zmq.SNDHWM, 200)
                if kind.hello is not None:
                    _ask(sock, _frames(kind.hello))
                self.floods.append(Flood(target, kind, sock))
        self.idle: list[socket.socket] = []
        self.strangers = {"attempts": 0, "replies": 0}

    def hold_idle_connections(self, count: int) -> int:
        """Open ``count`` TCP connections to each target that never say a word."""
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        for target in self.targets:
            host, port = target.endpoint.removeprefix("tcp://").rsplit(":", 1)
            for _ in range(count):
                with contextlib.suppress(OSError):
                    self.idle.append(socket.create_connection((host, int(port)), timeout=5))
        return len(self.idle)

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

    def run(self, keep_going: Callable[[], bool], progress: Callable[[str], None],
            every_second: Callable[[], None]) -> float:
        """Send until every flood reached its quota (or ``keep_going`` says stop)."""
        started = last = tick = time.monotonic()
        while keep_going() and any(f.frames < self.quota for f in self.floods):
            for flood in self.floods:
                flood.send_some(self.cfg, self.quota)
                flood.drain()
            if time.monotonic() - tick > 1:
                tick = time.monotonic()
                every_second()
            if time.monotonic() - last > 10:
                last = time.monotonic()
                sent = sum(f.frames for f in self.floods)
                progress(f"  {sent:,} hostile frames sent so far "
                         f"({sent / (last - started):,.0f}/s)")
        seconds = time.monotonic() - started
        settle = time.monotonic() + 5
        while time.monotonic() < settle:  # late replies
            for flood in self.floods:
                flood.drain()
            time.sleep(0.05)
        return seconds

    def status(self, target: Target) -> StatusReply | None:
        """The STATUS of the server behind ``target`` (its counters)."""
        sock = connect_dealer(self.ctx, target.endpoint, 0,
                              self.ring.client_curve("evaluator", target.shard))
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
        for f in self.floods:
            f.sock.close(linger=0)
        self.ctx.term()


def _rss_kb(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@click.command(context_settings={"show_default": True})
@click.option("--frames", "quota", default=100_000, type=int,
              help="Hostile frames of every class at each target.")
@click.option("--workers", default=8, type=int)
@click.option("--shards", default=4, type=int)
@click.option("--rounds", default=8000, type=int,
              help="Honest rounds; enough that the run outlasts the attack.")
@click.option("--rule", default="marmed")
@click.option("--proxy-attack", default="omniscient",
              help="The proxy in front of shard 0 (the omniscient one holds pushes).")
@click.option("--idle-connections", default=1100, type=int,
              help="Idle TCP connections held open to each target during the attack.")
@click.option("--strangers", default=200, type=int,
              help="Connection attempts with no key or an unknown key.")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def main(quota: int, workers: int, shards: int, rounds: int, rule: str, proxy_attack: str,
         idle_connections: int, strangers: int, json_path: Path | None) -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=workers, num_shards=shards, rule=rule,
                    rounds=rounds, seed=7).validate()
    attack = AttackConfig.build(proxy_attack=proxy_attack, proxy_shards=(0,),
                                proxy_victims=(0, 1)).validate(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        keys = out / "keys"
        create_keys(keys, shards, workers, proxies=(0,))
        spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=out / "run",
                           cluster=ClusterOptions(no_evaluator=False),
                           server=ServerOptions(),
                           security=SecurityOptions(keys=keys))
        report = _attack_cluster(spec, KeyRing(keys), quota, idle_connections, strangers)
    click.echo(json.dumps(report["summary"], indent=2))
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    ok = report["summary"]["crashes"] == 0 and report["summary"]["bit_identical"]
    raise SystemExit(0 if ok else 1)


def _attack_cluster(spec: ClusterSpec, ring: KeyRing, quota: int, idle: int,
                    strangers: int) -> dict:
    cfg = spec.cfg
    cluster = Cluster(spec)
    outcome: dict[str, ClusterResult | BaseException] = {}

    def run_cluster() -> None:
        try:
            outcome["result"] = cluster.run()
        except BaseException as exc:  # reported below: a crash of the honest run
            outcome["error"] = exc

    thread = threading.Thread(target=run_cluster, name="cluster")
    thread.start()
    endpoints = _await(spec.out_dir / "run", ["server-1", "proxy-0"], thread)
    _await_round(spec.out_dir / "server-0.jsonl", thread)
    nodes = {p.name: p.pid for p in cluster.processes
             if p.name.startswith(("server", "proxy")) and p.pid is not None}
    baseline = {name: _rss_kb(pid, "VmRSS") for name, pid in nodes.items()}
    shard_sizes = _shard_sizes(cfg)
    targets = [Target("server-1", endpoints["server-1"], 1, shard_sizes[1]),
               Target("proxy-0", endpoints["proxy-0"], 0, shard_sizes[0])]
    hostile = Attack(cfg, ring, targets, quota)
    try:
        held = hostile.hold_idle_connections(idle)
        click.echo(f"holding {held} idle connections; flooding {len(hostile.floods)} "
                   f"connections with {quota:,} frames each", err=True)
        hostile.strangers_try(strangers)
        round_at_start = _last_round(spec.out_dir / "server-0.jsonl")
        peaks = dict(baseline)
        hwm_before = {name: _rss_kb(pid, "VmHWM") for name, pid in nodes.items()}
        hwm = dict(hwm_before)

        def sample_peaks() -> None:  # once a second, while the nodes live
            for name, pid in nodes.items():
                peaks[name] = max(peaks[name], _rss_kb(pid, "VmRSS"))
                hwm[name] = max(hwm[name], _rss_kb(pid, "VmHWM"))

        seconds = hostile.run(thread.is_alive, lambda line: click.echo(line, err=True),
                              sample_peaks)
        sample_peaks()
        round_at_end = _last_round(spec.out_dir / "server-0.jsonl")
        counters = {t.name: (s.counters if (s := hostile.status(t)) else None) for t in targets}
        for s in hostile.idle:
            s.close()
        hostile.idle.clear()
        short = [f"{f.target.name}/{f.kind.name}" for f in hostile.floods if f.frames < quota]
    finally:
        hostile.close()
    thread.join()
    result = outcome.get("result")
    crashes = [p.name for p in cluster.processes if p.returncode not in (0, None)]
    pin_torch_threads(1)  # as the workers compute: the same sums in the same order
    reference = simulate(cfg, spec.attack) if isinstance(result, ClusterResult) else None
    classes = [{"target": f.target.name, "class": f.kind.name, "frames": f.frames,
                "messages": f.messages, "replies": dict(f.replies)} for f in hostile.floods]
    _print_table(classes)
    summary = {
        "frames_per_class_per_target": quota,
        "classes_short_of_quota": short,
        "hostile_frames": sum(c["frames"] for c in classes),
        "hostile_messages": sum(c["messages"] for c in classes),
        "error_replies": sum(n for c in classes for k, n in c["replies"].items()
                             if k not in ("welcome", "params", "statusreply")),
        "attack_seconds": round(seconds, 1),
        "honest_rounds_during_attack": [round_at_start, round_at_end],
        "idle_connections_held": held,
        "strangers": hostile.strangers,
        "crashes": len(crashes) + ("error" in outcome),
        "crashed": crashes + ([repr(outcome["error"])] if "error" in outcome else []),
        "server_counters": counters,
        "proxy_errors_answered": max((r.get("errors", 0) for r in read_jsonl(
            spec.out_dir / "proxy-0.jsonl")), default=0),
        # RSS sampled once a second, over its value when the attack began; and the
        # kernel's high-water mark over the one before the attack (0: not exceeded)
        "peak_rss_growth_mb": {n: round((peaks[n] - baseline[n]) / 1024, 1) for n in nodes},
        "high_water_mark_growth_mb": {n: round((hwm[n] - hwm_before[n]) / 1024, 1)
                                      for n in nodes},
        "run_finished": isinstance(result, ClusterResult),
        "bit_identical": bool(reference and result and reference.digest == result.digest),
    }
    return {"summary": summary, "classes": classes}


def _await(run_dir: Path, names: list[str], thread: threading.Thread) -> dict[str, str]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and thread.is_alive():
        files = {n: run_dir / f"{n}.endpoint" for n in names}
        if all(f.exists() for f in files.values()):
            return {n: f.read_text().strip() for n, f in files.items()}
        time.sleep(0.1)
    raise click.ClickException("the cluster did not come up")


def _await_round(metrics: Path, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 180
    while _last_round(metrics) < 1:
        if time.monotonic() > deadline or not thread.is_alive():
            raise click.ClickException("the cluster did not start training")
        time.sleep(0.1)


def _last_round(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(line)["round"] + 1
    return 0


def _shard_sizes(cfg: RunConfig) -> list[int]:
    from common.data import dataset_spec
    from common.models import build_model, num_parameters
    from common.sharding import shard_ranges

    spec = dataset_spec(cfg.dataset)
    d = num_parameters(build_model(cfg.model, spec.input_shape, spec.num_classes, cfg.seed))
    return [stop - start for start, stop in shard_ranges(d, cfg.num_shards)]


def _print_table(classes: list[dict]) -> None:
    click.echo(f"{'target':9} {'class':22} {'frames':>9} {'messages':>9}  replies")
    for c in classes:
        replies = ", ".join(f"{k} {n:,}" for k, n in sorted(c["replies"].items())) or "none"
        click.echo(f"{c['target']:9} {c['class']:22} {c['frames']:>9,} {c['messages']:>9,}"
                   f"  {replies}")


if __name__ == "__main__":
    main()
