"""The messaging floor: what ZeroMQ can do on this machine at all with the cluster's
message pattern (S shards spread over P server processes).

A synthetic cluster with exactly the real cluster's message pattern and (almost) no
Python work: n workers in W worker processes (contiguous blocks, as ``ps-cluster
--worker-processes W`` runs them), each worker with its own DEALER (and CURVE key) per
server process, and P server processes, each one ROUTER hosting a contiguous block of
the S shards (``common.net.sharding.server_blocks``, as ``ps-cluster --server-processes P``
spreads them). Every round each worker spins ``compute_ms`` (standing in for its
gradient), pushes to every server process one message carrying its float32 slices of
all the shards the process hosts (one contiguous frame: a block's ranges are adjacent),
with the protocol's framing (``[b"", msgpack header, values]``), and waits for the P
replies; each server process copies the n pushes into one (n, d/S) matrix per hosted
shard, spins ``aggregate_ms`` once per hosted shard (each shard is aggregated on its
own, standing in for the rule) and answers each worker with its shards' parameters
(one frame per shard, as PARAMS carries them), or, for every worker of a process but
its first, a bare PARAMS (the header alone: the process holds the values from its first
worker's reply, as ``worker/run.py`` does). CURVE encrypts every message as a cluster
with keys does (without a ZAP handler: the real one runs once per connection, not per
message, so it does not change the per-round figure).

Each round costs n*P round trips, and each message crosses three threads (the sender's
ZeroMQ I/O thread, the receiver's, and the receiving process): on a machine with few
cores that per-message cost, not Python, bounds the cluster; hosting several shards in
one process cuts the messages, not the aggregations. With P = S (the default) it is one
process and socket per shard.
``scripts/bench_cluster.py`` runs this beside the real cluster and prints both:

    python3 scripts/bench_floor.py --shards 4,20 --compute-ms 0.5               # P = S
    python3 scripts/bench_floor.py --shards 4,20,20 --processes 4,4,20          # S:P
    python3 scripts/bench_floor.py --shards 4,20 --processes 4                  # P=4 for all
    python3 scripts/bench_floor.py --shards 4 --worker-processes 4              # W=4
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

from common.net.protocol import PROTOCOL_VERSION, Op
from common.net.sharding import server_blocks, shard_ranges

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
    processes: int = 0  # server processes (0 in records from before P existed: P = S)
    worker_processes: int = 0  # W (0 in records from before W existed: W = n)


def _spin(ms: float) -> None:
    """Busy-wait ``ms`` milliseconds (CPU used as a gradient or a rule would use it)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def _server(pipe: Connection, workers: int, shards: list[int], lengths: list[int],
            rounds: int, aggregate_ms: float, keys: tuple[bytes, bytes] | None) -> None:
    """Serve ``rounds`` rounds of the hosted ``shards`` (``lengths`` values each, adjacent
    in the model vector): one PUSH in and one PARAMS out per worker and round (bare if
    the push asked so)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    if keys is not None:
        sock.curve_publickey, sock.curve_secretkey = keys
        sock.curve_server = True
    sock.bind("tcp://127.0.0.1:*")
    pipe.send(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    offsets = np.cumsum([0, *lengths]).tolist()
    rows = [np.empty((workers, n), dtype=np.float32) for n in lengths]  # one per shard
    params = [np.zeros(n, dtype=np.float32) for n in lengths]
    fields = {"v": PROTOCOL_VERSION, "op": int(Op.PARAMS), "round": 0, "shards": shards,
              "length": offsets[-1]}
    header = msgpack.packb(fields)
    bare = msgpack.packb(fields | {"bare": True})
    for _ in range(rounds):
        envelopes = []
        while len(envelopes) < workers:
            frames = sock.recv_multipart(copy=False)
            push = msgpack.unpackb(frames[2].buffer)
            values = np.frombuffer(frames[3].buffer, dtype=np.float32)
            for k, matrix in enumerate(rows):  # each shard's slice into its own matrix
                matrix[push["worker"]] = values[offsets[k]:offsets[k + 1]]
            envelopes.append((frames[0], push.get("bare_params", False)))
        for _ in shards:  # each shard is aggregated on its own
            _spin(aggregate_ms)
        for envelope, bare_params in envelopes:
            reply = [bare] if bare_params else [header, *params]
            sock.send_multipart([envelope, b"", *reply], copy=False)
    pipe.recv()  # the parent says when every worker has its last reply
    sock.close(linger=0)
    ctx.term()


def _workers(pipe: Connection, team: tuple[int, ...], endpoints: list[str],
             spans: list[tuple[int, int]], d: int, rounds: int, compute_ms: float,
             server_keys: list[bytes] | None) -> None:
    """Run ``rounds`` rounds as the workers ``team`` of one process (``spans[p]``: the
    contiguous part of the model server process ``p`` hosts): each its own sockets, all
    on one poll, the first asking for the values, the others for bare PARAMS; report
    the time after each round."""
    ctx = zmq.Context()
    links = []  # (worker, server process, socket)
    for worker in team:
        for p, endpoint in enumerate(endpoints):
            sock = ctx.socket(zmq.DEALER)
            if server_keys is not None:
                sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
                sock.curve_serverkey = server_keys[p]
            sock.connect(endpoint)
            links.append((worker, p, sock))
    gradient = np.ones(d, dtype=np.float32)
    x = np.empty(d, dtype=np.float32)
    poller = zmq.Poller()
    for *_, sock in links:
        poller.register(sock, zmq.POLLIN)
    which = {sock: p for _, p, sock in links}
    for t in range(rounds):
        for worker in team:
            _spin(compute_ms)
            for w, p, sock in links:
                if w != worker:
                    continue
                start, stop = spans[p]
                header = msgpack.packb({"v": PROTOCOL_VERSION, "op": int(Op.PUSH),
                                        "round": t, "worker": worker, "length": stop - start,
                                        "pull_next": True, "bare_params": worker != team[0]})
                sock.send_multipart([b"", header, gradient[start:stop]], copy=False)
        pending = len(links)
        while pending:
            for sock, _ in poller.poll():
                at = spans[which[sock]][0]
                for frame in sock.recv_multipart(copy=False)[2:]:  # one per shard, or none
                    values = np.frombuffer(frame.buffer, dtype=np.float32)
                    x[at:at + values.size] = values
                    at += values.size
                pending -= 1
        pipe.send(time.perf_counter())
    for *_, sock in links:
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
                  aggregate_ms: float = 0.0, rounds: int = 200, warmup: int = 20,
                  processes: int | None = None, worker_processes: int | None = None) -> Floor:
    """Rounds/s and CPU per round of the synthetic cluster with ``shards`` shards on
    ``processes`` server processes (default: one per shard) and the workers in
    ``worker_processes`` processes (default: one per worker), timed after ``warmup``
    rounds (from the round every process has finished to the last)."""
    ctx = mp.get_context("fork")
    total = warmup + rounds
    processes = processes or shards
    ranges = shard_ranges(d, shards)
    blocks = server_blocks(shards, processes)
    spans = [(ranges[b[0]][0], ranges[b[-1]][1]) for b in blocks]
    server_keys = [zmq.curve_keypair() for _ in blocks] if curve else None
    children: list[mp.process.BaseProcess] = []
    try:
        server_pipes = []
        for p, block in enumerate(blocks):
            here, there = ctx.Pipe()
            keys = server_keys[p] if server_keys else None
            lengths = [ranges[s][1] - ranges[s][0] for s in block]
            children.append(ctx.Process(target=_server, args=(
                there, workers, list(block), lengths, total, aggregate_ms, keys),
                daemon=True))
            children[-1].start()
            server_pipes.append(here)
        endpoints = [_receive(p, children) for p in server_pipes]
        publics = [k[0] for k in server_keys] if server_keys else None
        worker_pipes = []
        worker_processes = worker_processes or workers
        for team in server_blocks(workers, worker_processes):  # contiguous, as the workers'
            here, there = ctx.Pipe()
            children.append(ctx.Process(target=_workers, args=(
                there, team, endpoints, spans, d, total, compute_ms, publics), daemon=True))
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
                 rounds / (finished - started), cpu / rounds * 1e3, processes,
                 worker_processes)


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


def _layouts(shards: str, processes: str | None) -> list[tuple[int, int]]:
    """(S, P) pairs from ``--shards`` and ``--processes`` (aligned, one P for all, or
    none: P = S)."""
    counts = [int(s) for s in shards.split(",")]
    if processes is None:
        return [(s, s) for s in counts]
    per = [int(p) for p in processes.split(",")]
    if len(per) == 1:
        per *= len(counts)
    if len(per) != len(counts):
        raise click.BadParameter(f"{len(per)} values for {len(counts)} --shards: give one "
                                 f"P per S, or a single P for all", param_hint="--processes")
    for s, p in zip(counts, per, strict=True):
        if not 1 <= p <= s:
            raise click.BadParameter(f"P={p} for S={s}: must be in 1..S",
                                     param_hint="--processes")
    return list(zip(counts, per, strict=True))


@click.command(context_settings={"show_default": True})
@click.option("--workers", default=20, type=int)
@click.option("--shards", default="4,20", help="Numbers of shards S, comma-separated.")
@click.option("--processes", default=None, help="Server processes P for each S: a comma "
              "list aligned with --shards, or one value for all. Default: P = S (one "
              "process per shard).")
@click.option("--worker-processes", default=None, type=click.IntRange(min=1), help="Worker "
              "processes W, the workers in contiguous blocks. Default: one per worker.")
@click.option("--d", "d", default=118_282, type=int, help="Parameters (the paper's MLP).")
@click.option("--compute-ms", default=0.5, type=float, help="CPU per gradient.")
@click.option("--aggregate-ms", default=0.3, type=float, help="CPU per shard's aggregation.")
@click.option("--rounds", default=200, type=int)
@click.option("--insecure", is_flag=True, help="Without CURVE.")
@click.option("--json", "json_path", default=None, type=click.Path(path_type=Path))
def main(workers: int, shards: str, processes: str | None, worker_processes: int | None,
         d: int, compute_ms: float, aggregate_ms: float, rounds: int, insecure: bool,
         json_path: Path | None) -> None:
    """Print the floor's rounds/s and CPU per round for each S and P."""
    if worker_processes is not None and worker_processes > workers:
        raise click.BadParameter(f"W={worker_processes}: must be in 1..n={workers}",
                                 param_hint="--worker-processes")
    floors = [measure_floor(workers, s, d, not insecure, compute_ms, aggregate_ms, rounds,
                            processes=p, worker_processes=worker_processes)
              for s, p in _layouts(shards, processes)]
    click.echo("| S | P | W | CURVE | rounds/s | CPU per round |")
    click.echo("|---|---|---|---|---|---|")
    for f in floors:
        click.echo(f"| {f.shards} | {f.processes} | {f.worker_processes} | "
                   f"{'yes' if f.curve else 'no'} | {f.rounds_per_s:.1f} | "
                   f"{f.cpu_ms_per_round:.0f} ms |")
    if json_path:
        json_path.write_text(json.dumps([asdict(f) for f in floors], indent=2))


if __name__ == "__main__":
    main()
