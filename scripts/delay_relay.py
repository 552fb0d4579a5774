#!/usr/bin/env python3
"""A TCP relay that adds latency: every chunk read from one side of a connection is
written to the other side ``--delay-ms`` +- uniform ``--jitter-ms`` later, in order.

Each direction of each connection is a pipe of its own. A chunk read at time t is due
at t + delay + U(-jitter, +jitter) and is released at max(its due time, the release
time of the chunk before it), so jitter never reorders the bytes of a connection and a
stream keeps its throughput (chunks in flight overlap; the delay is not per round
trip). The end of a stream travels the same way: once one side closes and what it sent
before is delivered, the relay closes both sides. When the target refuses the
connection the client's side is closed at once.

Standard library only; no netem needed (the kernel here has none). A relay is one
process: ``--listen HOST:0`` takes a free port, and the address it got is printed as
``ready HOST:PORT`` (and written to ``--ready-file``, atomically) once it listens.
SIGTERM or SIGINT stop it cleanly (exit 0).

    python3 scripts/delay_relay.py --listen 127.0.0.1:0 --to 10.0.0.2:5550 \\
        --delay-ms 20 --jitter-ms 5 --seed 1 --ready-file /tmp/relay.ready
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from pathlib import Path

CHUNK_BYTES = 64 * 1024
QUEUE_CHUNKS = 256  # per direction: at most 16 MiB in flight, then the reader waits


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a (host, port) pair."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class Delay:
    """Draws each chunk's one-way delay in seconds: delay +- uniform jitter, never < 0."""

    def __init__(self, delay_ms: float, jitter_ms: float, seed: int | None) -> None:
        self.delay_s = delay_ms / 1000
        self.jitter_s = jitter_ms / 1000
        self.rng = random.Random(seed)

    def draw(self) -> float:
        if self.jitter_s <= 0:
            return self.delay_s
        return max(0.0, self.delay_s + self.rng.uniform(-self.jitter_s, self.jitter_s))


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _read(reader: asyncio.StreamReader, queue: asyncio.Queue, delay: Delay) -> None:
    """Read chunks and queue each with its release time; None marks the end."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        try:
            data = await reader.read(CHUNK_BYTES)
        except (ConnectionError, OSError):
            data = b""
        # in order: never before the previous chunk's release
        last = max(loop.time() + delay.draw(), last)
        await queue.put((last, data or None))
        if not data:
            return


async def _write(writer: asyncio.StreamWriter, queue: asyncio.Queue) -> None:
    """Write each queued chunk at its release time; return at the end marker."""
    loop = asyncio.get_running_loop()
    while True:
        release, data = await queue.get()
        wait = release - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if data is None:
            return
        writer.write(data)
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: Delay) -> None:
    """One direction of a connection, until its end has been delivered."""
    queue: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)
    read = asyncio.ensure_future(_read(reader, queue, delay))
    try:
        await _write(writer, queue)
    except (ConnectionError, OSError):
        pass
    finally:
        read.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await read


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


class Relay:
    """Accepts connections on ``listen`` and relays each to ``target`` with ``delay``."""

    def __init__(self, target: tuple[str, int], delay: Delay) -> None:
        self.target = target
        self.delay = delay
        self.connections: set[asyncio.Task] = set()

    async def handle(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.connections.add(task)
        try:
            await self._relay(client_r, client_w)
        except asyncio.CancelledError:
            pass  # the relay stops: both sides are closed below
        finally:
            _close(client_w)
            self.connections.discard(task)

    async def _relay(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        _nodelay(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            return  # the target refused: the client's side is closed
        _nodelay(server_w)
        pipes = [asyncio.ensure_future(_pipe(client_r, server_w, self.delay)),
                 asyncio.ensure_future(_pipe(server_r, client_w, self.delay))]
        try:
            # one side closed (and what it sent arrived): close the other too
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            _close(server_w)
            for p in pipes:
                p.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)


async def serve(listen: tuple[str, int], relay: Relay, ready_file: Path | None) -> None:
    """Listen until SIGTERM/SIGINT, then close the listener and every connection."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await asyncio.start_server(relay.handle, *listen, reuse_address=True)
    host, port = server.sockets[0].getsockname()[:2]
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if ready_file is not None:
        tmp = ready_file.with_name(ready_file.name + ".tmp")
        tmp.write_text(where + "\n", encoding="utf-8")
        os.replace(tmp, ready_file)
    print(f"ready {where}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        for task in list(relay.connections):
            task.cancel()
        await asyncio.gather(*relay.connections, return_exceptions=True)
        await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", type=address, required=True,
                        help="HOST:PORT to accept on (port 0: a free one)")
    parser.add_argument("--to", type=address, required=True, help="HOST:PORT to relay to")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="one-way delay added to each chunk, each direction")
    parser.add_argument("--jitter-ms", type=float, default=0.0,
                        help="uniform jitter +- this around the delay (order is kept)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the jitter draws")
    parser.add_argument("--ready-file", type=Path, default=None,
                        help="write HOST:PORT here once listening")
    args = parser.parse_args(argv)
    if args.delay_ms < 0 or args.jitter_ms < 0:
        parser.error("--delay-ms and --jitter-ms must be >= 0")
    relay = Relay(args.to, Delay(args.delay_ms, args.jitter_ms, args.seed))
    try:
        asyncio.run(serve(args.listen, relay, args.ready_file))
    except OSError as exc:
        print(f"delay_relay: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
