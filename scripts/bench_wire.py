"""Throughput of the wire framing between two processes on loopback TCP.

Compares the protocol's framing (msgpack header + raw float32 chunks, sent and
received with copy=False, decoded with np.frombuffer) against the same arrays
packed inside one msgpack message, and the framing encrypted by CURVE (as a cluster
with keys sends it), in one run:

    python3 scripts/bench_wire.py --sizes-mb 0.5,4,40
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time

import click
import msgpack
import numpy as np
import zmq

from common.net.protocol import Push, decode, encode

MODES = ("protocol-frames", "msgpack-embedded")


def _receiver(endpoint: str, mode: str, count: int, length: int,
              server_key: bytes | None = None) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    if server_key is not None:  # a CURVE client with a throwaway key pair
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = server_key
    sock.connect(endpoint)
    total = 0.0
    for _ in range(count):
        frames = sock.recv_multipart(copy=False)
        if mode == "protocol-frames":
            values = decode(frames).tensor()
        else:
            body = msgpack.unpackb(frames[0].buffer)
            values = np.frombuffer(body["data"], dtype="<f4")
        total += float(values[-1])  # touch the data
    ack = ctx.socket(zmq.PUSH)
    ack.connect(endpoint.rsplit(":", 1)[0] + ":" + str(int(endpoint.rsplit(":", 1)[1]) + 1))
    ack.send(str(total).encode())
    ack.close()
    sock.close()
    ctx.term()


def measure(mode: str, size_mb: float, count: int, curve: bool = False) -> float:
    """GB/s moving ``count`` messages of ``size_mb`` MB of float32 in ``mode``; with
    ``curve``, encrypted and authenticated by CURVE as a cluster with keys sends them."""
    length = int(size_mb * 1e6 / 4)
    values = np.random.default_rng(0).standard_normal(length).astype(np.float32)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    server_key = None
    if curve:
        server_key, secret = zmq.curve_keypair()
        sock.curve_secretkey, sock.curve_publickey = secret, server_key
        sock.curve_server = True
    port = sock.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=60000)
    ack = ctx.socket(zmq.PULL)
    ack.bind(f"tcp://127.0.0.1:{port + 1}")
    child = mp.get_context("fork").Process(
        target=_receiver, args=(f"tcp://127.0.0.1:{port}", mode, count, length, server_key))
    child.start()
    header = Push(round=0, worker=0, length=length)
    started = time.perf_counter()
    for _ in range(count):
        if mode == "protocol-frames":
            sock.send_multipart(encode(header, values), copy=False)
        else:
            sock.send(msgpack.packb({"round": 0, "worker": 0, "data": values.tobytes()}))
    ack.recv()
    seconds = time.perf_counter() - started
    child.join()
    sock.close(linger=0)
    ack.close(linger=0)
    ctx.term()
    return count * length * 4 / seconds / 1e9


@click.command(context_settings={"show_default": True})
@click.option("--sizes-mb", default="0.5,4,40", help="Comma-separated message sizes in MB.")
@click.option("--total-mb", default=2000.0, help="Data moved per measurement.")
@click.option("--json", "json_path", default=None, help="Also write the figures here.")
def main(sizes_mb: str, total_mb: float, json_path: str | None) -> None:
    results = []
    click.echo(f"{'size MB':>8} {'protocol GB/s':>14} {'msgpack GB/s':>13} {'ratio':>6} "
               f"{'protocol + CURVE GB/s':>22}")
    for size in (float(s) for s in sizes_mb.split(",")):
        count = max(5, int(total_mb / size))
        framed = measure(MODES[0], size, count)
        embedded = measure(MODES[1], size, count)
        curve = measure(MODES[0], size, max(5, count // 4), curve=True)
        results.append({"size_mb": size, "protocol_gbps": framed, "msgpack_gbps": embedded,
                        "protocol_curve_gbps": curve})
        click.echo(f"{size:8g} {framed:14.2f} {embedded:13.2f} {framed / embedded:6.1f} "
                   f"{curve:22.2f}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
