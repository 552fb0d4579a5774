"""The messaging floor: what one-process-per-shard ZeroMQ can do on this machine at all.

A synthetic cluster with exactly the real cluster's message pattern and (almost) no
Python work: n worker processes, each with one DEALER per server, and S server
processes, each one ROUTER; every round each worker spins ``compute_ms`` (standing in
for its gradient), pushes its d/S float32 slice to every server with the protocol's
framing (``[b"", msgpack header, values]``) and waits for the S replies; each server
copies the n pushes into its (n, d/S) matrix, spins ``aggregate_ms`` (standing in for
the rule) and answers each worker with its parameters. CURVE encrypts every message as
a cluster with keys does (without a ZAP handler: the real one runs once per connection,
not per message, so it does not change the per-round figure).

Each round costs n*S round trips, and each message crosses three threads (the sender's
ZeroMQ I/O thread, the receiver's, and the receiving process): on a machine with few
cores that per-message cost, not Python, bounds any design that gives each shard its own
process and socket.
``scripts/bench_cluster.py`` runs this beside the real cluster and prints both:

    python3 scripts/bench_floor.py --shards 4,20 --compute-ms 0.5
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import click
import msgpack
import numpy as np
import zmq

from common.protocol import PROTOCOL_VERSION, Op

DEADLINE_S = 300.0


@dataclass(frozen=True)
class Floor:
    """One synthetic cluster's figures."""

    workers: int
    shards: int
    d: int
    curve: bool
    compute_ms: float
    aggregate_ms: float
    rounds_per_s: float
    cpu_ms_per_round: float


def _spin(ms: float) -> None:
    """Busy-wait ``ms`` milliseconds (CPU used as a gradient or a rule would use it)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def _server(pipe: Connection, workers: int, length: int, rounds: int, aggregate_ms: float,
            keys: tuple[bytes, bytes] | None) -> None:
    """Serve ``rounds`` rounds of one shard of ``length`` values."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    if keys is not None:
        sock.curve_publickey, sock.curve_secretkey = keys
        sock.curve_server = True
    sock.bind("tcp://127.0.0.1:*")
    pipe.send(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    rows = np.empty((workers, length), dtype=np.float32)
    params = np.zeros(length, dtype=np.float32)
    header = msgpack.packb({"v": PROTOCOL_VERSION, "op": int(Op.PARAMS), "round": 0,
                            "shard": 0, "length": length})
    for _ in range(rounds):
        envelopes = []
        while len(envelopes) < workers:
            frames = sock.recv_multipart(copy=False)
            worker = msgpack.unpackb(frames[2].buffer)["worker"]
            rows[worker] = np.frombuffer(frames[3].buffer, dtype=np.float32)
            envelopes.append(frames[0])
        _spin(aggregate_ms)
        for envelope in envelopes:
            sock.send_multipart([envelope, b"", header, params], copy=False)
    pipe.recv()  # the parent says when every worker has its last reply
    sock.close(linger=0)
    ctx.term()


def _worker(pipe: Connection, index: int, endpoints: list[str], d: int, rounds: int,
            compute_ms: float, server_keys: list[bytes] | None) -> None:
    """Run ``rounds`` rounds as worker ``index``; report the time after each round."""
    ctx = zmq.Context()
    socks = []
    for s, endpoint in enumerate(endpoints):
        sock = ctx.socket(zmq.DEALER)
        if server_keys is not None:
            sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
            sock.curve_serverkey = server_keys[s]
        sock.connect(endpoint)
        socks.append(sock)
    bounds = np.cumsum([0, *(len(p) for p in np.array_split(np.arange(d), len(endpoints)))])
    gradient = np.ones(d, dtype=np.float32)
    x = np.empty(d, dtype=np.float32)
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    which = {sock: s for s, sock in enumerate(socks)}
    for t in range(rounds):
        _spin(compute_ms)
        for s, sock in enumerate(socks):
            header = msgpack.packb({"v": PROTOCOL_VERSION, "op": int(Op.PUSH), "round": t,
                                    "worker": index,
                                    "length": int(bounds[s + 1] - bounds[s]),
                                    "pull_next": True})
            sock.send_multipart([b"", header, gradient[bounds[s]:bounds[s + 1]]], copy=False)
        pending = len(socks)
        while pending:
            for sock, _ in poller.poll():
                s = which[sock]
                frames = sock.recv_multipart(copy=False)
                x[bounds[s]:bounds[s + 1]] = np.frombuffer(frames[2].buffer, dtype=np.float32)
                pending -= 1
        pipe.send(time.perf_counter())
    for sock in socks:
        sock.close(linger=0)
    ctx.term()


def _cpu_seconds(pids: list[int]) -> float:
    """utime + stime of ``pids`` (each with all its threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def measure_floor(workers: int, shards: int, d: int, curve: bool, compute_ms: float,
                  aggregate_ms: float = 0.0, rounds: int = 200, warmup: int = 20) -> Floor:
    """Rounds/s and CPU per round of the synthetic cluster, timed after ``warmup`` rounds
    (from the round every worker has finished to the last)."""
    ctx = mp.get_context("fork")
    total = warmup + rounds
    length = [len(p) for p in np.array_split(np.arange(d), shards)]
    server_keys = [zmq.curve_keypair() for _ in range(shards)] if curve else None
    children: list[mp.process.BaseProcess] = []
    try:
        server_pipes = []
        for s in range(shards):
            here, there = ctx.Pipe()
            keys = server_keys[s] if server_keys else None
            children.append(ctx.Process(target=_server, args=(
                there, workers, length[s], total, aggregate_ms, keys), daemon=True))
            children[-1].start()
            server_pipes.append(here)
        endpoints = [_receive(p, children) for p in server_pipes]
        publics = [k[0] for k in server_keys] if server_keys else None
        worker_pipes = []
        for i in range(workers):
            here, there = ctx.Pipe()
            children.append(ctx.Process(target=_worker, args=(
                there, i, endpoints, d, total, compute_ms, publics), daemon=True))
            children[-1].start()
            worker_pipes.append(here)
        pids = [c.pid for c in children if c.pid is not None]
        for _ in range(warmup):
            started = max(_receive(p, children) for p in worker_pipes)
        cpu_before = _cpu_seconds(pids)
        for _ in range(rounds):
            finished = max(_receive(p, children) for p in worker_pipes)
        cpu = _cpu_seconds(pids) - cpu_before
        for pipe in server_pipes:
            pipe.send(None)
        for child in children:
            child.join(timeout=10)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join(timeout=5)
    return Floor(workers, shards, d, curve, compute_ms, aggregate_ms,
                 rounds / (finished - started), cpu / rounds * 1e3)


def _receive(pipe: Connection, children: list[mp.process.BaseProcess]) -> Any:
    """The next object from a child; ``RuntimeError`` as soon as a node died, or after
    ``DEADLINE_S`` without it."""
    deadline = time.monotonic() + DEADLINE_S
    while not pipe.poll(1.0):
        dead = [c.name for c in children if c.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"synthetic node(s) {', '.join(dead)} died")
        if time.monotonic() > deadline:
            raise RuntimeError(f"a synthetic node sent nothing for {DEADLINE_S:g} s")
    return pipe.recv()


@click.command(context_settings={"show_default": True})
@click.option("--workers", default=20, type=int)
@click.option("--shards", default="4,20", help="Numbers of servers, comma-separated.")
@click.option("--d", "d", default=118_282, type=int, help="Parameters (the paper's MLP).")
@click.option("--compute-ms", default=0.5, type=float, help="CPU per gradient.")
@click.option("--aggregate-ms", default=0.3, type=float, help="CPU per aggregation.")
@click.option("--rounds", default=200, type=int)
@click.option("--insecure", is_flag=True, help="Without CURVE.")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def main(workers: int, shards: str, d: int, compute_ms: float, aggregate_ms: float,
         rounds: int, insecure: bool, json_path: Path | None) -> None:
    """Print the floor's rounds/s and CPU per round for each S."""
    floors = [measure_floor(workers, int(s), d, not insecure, compute_ms, aggregate_ms, rounds)
              for s in shards.split(",")]
    click.echo("| S | CURVE | rounds/s | CPU per round |")
    click.echo("|---|---|---|---|")
    for f in floors:
        click.echo(f"| {f.shards} | {'yes' if f.curve else 'no'} | {f.rounds_per_s:.1f} | "
                   f"{f.cpu_ms_per_round:.0f} ms |")
    if json_path:
        json_path.write_text(json.dumps([asdict(f) for f in floors], indent=2))


if __name__ == "__main__":
    main()
