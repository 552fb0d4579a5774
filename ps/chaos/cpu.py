"""Phase 3 of the chaos run: the CPU a standalone server (shard 1, from the code of a
given tree: this one, or a checkout from before the insider changes) spends on the most
expensive headers it still accepts or answers, from one key, in CPU-ms per 1,000 messages
over the same interval without them; the worst of them per tree.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import msgpack
import zmq

from common.net.keys import KeyRing
from common.net.protocol import PROTOCOL_VERSION, Op, Pull, Status, StatusReply, Welcome
from common.net.transport import connect_dealer
from ps.chaos.classes import Frames, frames_of, reply_header
from ps.chaos.keyholders import cpu_s
from ps.launcher.processes import die_with_parent

_PROBE = """
import json, sys
from common.run.config import RunConfig
from common.conf.settings import SERVER, to_argv
cfg = RunConfig.from_settings(**json.loads(sys.argv[1])).validate()
print(json.dumps({"hash": cfg.config_hash, "config": cfg.to_dict(),
                  "argv": to_argv(cfg, SERVER)}, default=str))
"""


def _tree_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PS_")}
    return {**env, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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
        "status": frames_of(Status()),
        "pull-current-round": frames_of(Pull(round=0, worker=worker)),
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
    cpu0, t0 = cpu_s(pid), time.monotonic()
    sent = answered = 0
    synced_at = last_reply = 0.0
    while True:
        while sock.poll(0):
            header = reply_header(sock.recv_multipart())
            last_reply = time.monotonic()
            if synced_at and isinstance(header, sync_reply):
                return {"cpu_s": cpu_s(pid) - cpu0, "wall_s": time.monotonic() - t0,
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
        if not sock.poll(30_000) or not isinstance(reply_header(sock.recv_multipart()),
                                                   Welcome):
            raise click.ClickException(f"the server from {tree} did not WELCOME")
        for name, frames in candidates.items():
            # the sync: STATUS, or after STATUSes a HELLO (told apart by its reply)
            sync = (valid, Welcome) if name == "status" else (frames_of(Status()), StatusReply)
            runs = []
            for _ in range(repeats):
                flood = _flood_cpu(sock, proc.pid, frames, count, sync,
                                   None if "bogus" in name or "7000" in name else 64)
                idle0 = cpu_s(proc.pid)
                time.sleep(flood["wall_s"])  # the same interval without the flood
                idle = cpu_s(proc.pid) - idle0
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


def cpu_summary(cpu: dict) -> dict:
    """Per tree: the worst accepted candidate and its CPU-ms per 1,000; every candidate."""
    return {label: {"worst": r["worst_accepted"],
                    "cpu_ms_per_1000": r["worst_accepted_cpu_ms_per_1000"],
                    "all": {k: v["cpu_ms_per_1000"] for k, v in r["candidates"].items()}}
            for label, r in cpu.items()}
