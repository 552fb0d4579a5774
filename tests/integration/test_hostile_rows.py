"""Regression tests through real processes for messages and loads that used to crash or
exhaust a server or a proxy: each node must refuse them, stay bounded, and keep serving
the honest workers to the end of the run."""

from __future__ import annotations

import errno
import os
import resource
import socket
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from common.conf.settings import PROXY, SERVER, WORKER, to_argv
from common.net.protocol import (
    CHUNK_BYTES,
    PROTOCOL_VERSION,
    Error,
    ErrorCode,
    Header,
    Hello,
    Op,
    Params,
    Pull,
    Push,
    Status,
    StatusReply,
    Welcome,
    decode,
    encode,
)
from common.net.transport import MAX_ROUTING_ID_BYTES
from common.run.config import AttackConfig, RunConfig
from ps.launcher.processes import ManagedProcess
from server.checkpoint import checkpoint_path, read_run_checkpoint
from server.core import MAX_PARKED_PER_PEER
from tests.integration.conftest import Processes, RawPeer, wait_for

pytestmark = pytest.mark.integration

CFG = RunConfig(dataset="synthetic", num_workers=2, num_shards=1, rule="mean", q=0,
                rounds=4, seed=5).validate()
ALL = f"0-{CFG.num_workers - 1}"  # every worker, in one process
# for the future-round flood: rounds 2..601 must all lie inside the run
LONG = RunConfig(dataset="synthetic", num_workers=2, num_shards=1, rule="mean", q=0,
                 rounds=1000, seed=5).validate()
MB = 1 << 20


# -- processes -------------------------------------------------------------------------


def start_server(processes: Processes, tmp_path: Path, cfg: RunConfig = CFG,
                 *extra: str) -> tuple[ManagedProcess, str]:
    """An insecure server of shard 0 writing into ``tmp_path / "out"``; its endpoint."""
    ready = tmp_path / "server.endpoint"
    proc = processes.start("server-0", "server.cli", [
        "--shard", "0", "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
        "--out-dir", str(tmp_path / "out"), "--linger", "0", "--insecure", *extra,
        *to_argv(cfg, SERVER)])
    return proc, processes.endpoint(ready, proc)


def start_proxy(processes: Processes, tmp_path: Path, server: str, attack: str,
                cfg: RunConfig = CFG) -> tuple[ManagedProcess, str]:
    """An insecure proxy running ``attack`` in front of ``server``; its endpoint."""
    victims = (0,) if attack == "omniscient" else ()
    config = AttackConfig.build(proxy_attack=attack, proxy_victims=victims).validate(cfg)
    ready = tmp_path / "proxy.endpoint"
    proc = processes.start("proxy-0", "ps.proxy.cli", [
        "--bind", "tcp://127.0.0.1:*", "--server", server, "--shard", "0",
        "--ready-file", str(ready), "--out-dir", str(tmp_path / "out"), "--insecure",
        *to_argv(config, PROXY), *to_argv(config.attack(attack), PROXY), *to_argv(cfg, PROXY)])
    return proc, processes.endpoint(ready, proc)


def start_workers(processes: Processes, endpoint: str, ids: list[int] | list[str],
                  cfg: RunConfig = CFG) -> list[ManagedProcess]:
    """A worker process per id (or team of ids: ``0-3`` runs four in one process)."""
    return [processes.start(f"worker-{i}", "worker.cli", [
        "--servers", endpoint, "--worker-id", str(i), "--timeout", "60", "--insecure",
        *to_argv(cfg, WORKER)]) for i in ids]


def memory_mb(proc: ManagedProcess) -> dict[str, float]:
    """``VmRSS`` (now) and ``VmHWM`` (peak) of a process, in MB."""
    fields = {}
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def reset_peak(proc: ManagedProcess) -> float:
    """Make the process's peak RSS its current RSS (``clear_refs``); that RSS in MB."""
    Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
    return memory_mb(proc)["VmHWM"]


def open_files(proc: ManagedProcess) -> int:
    return len(os.listdir(f"/proc/{proc.pid}/fd"))


def log_text(proc: ManagedProcess) -> str:
    return proc.log_path.read_text(encoding="utf-8", errors="replace")


def push(round_: int, worker: int, values: np.ndarray) -> list[bytes]:
    return [b"", *encode(Push(round=round_, worker=worker, length=values.size), values)]


def hello(role: str = "monitor", worker: int = -1, cfg: RunConfig = CFG) -> list[bytes]:
    return [b"", *encode(Hello(role=role, worker=worker, config_hash=cfg.config_hash))]


def status() -> list[bytes]:
    return [b"", *encode(Status())]


def shard_size(peer: RawPeer, cfg: RunConfig = CFG) -> int:
    """The shard's number of values, from a WELCOME (the peer says HELLO as a monitor)."""
    welcome = peer.ask(hello(cfg=cfg))
    assert isinstance(welcome, Welcome), welcome
    return welcome.length


def assert_errors(replies: list[Header], code: ErrorCode) -> None:
    bad = [r for r in replies if not (isinstance(r, Error) and r.code == code.value)]
    assert not bad, f"{len(bad)} of {len(replies)} replies are not {code.value}: {bad[:3]}"


def finish(processes: Processes, nodes: list[ManagedProcess],
           workers: list[ManagedProcess]) -> None:
    """The workers and then the nodes exit 0 (the run went to its end)."""
    for proc in [*workers, *nodes]:
        code = processes.wait_exit(proc, 120)
        assert code == 0, (proc.name, code, proc.tail())


# -- 1. a HELLO whose settings map has a bytes key ---------------------------------------


def test_hello_with_a_bytes_settings_key_is_refused_by_server_and_through_proxy(
        processes, peers, tmp_path) -> None:
    server_proc, server = start_server(processes, tmp_path)
    proxy_proc, proxy = start_proxy(processes, tmp_path, server, "gambler")
    # a header holds no bytes: the decoder refuses the bytes key (it once reached the
    # settings comparison, where it could not be sorted among the str keys), answered
    # malformed, never "internal"
    header = msgpack.packb({
        "v": PROTOCOL_VERSION, "op": int(Op.HELLO), "role": "worker", "worker": 0,
        "config_hash": "0" * 16, "config": {**CFG.to_dict(), b"lr": 1}})
    for endpoint in (server, proxy):
        reply = peers(endpoint).ask([b"", header])
        assert isinstance(reply, Error), (endpoint, reply)
        assert reply.code == ErrorCode.MALFORMED.value and "max_bin_len" in reply.message
    assert server_proc.running and proxy_proc.running
    workers = start_workers(processes, proxy, [ALL])
    finish(processes, [proxy_proc, server_proc], workers)


# -- 2. pushes a proxy must refuse before corrupting or holding them ---------------------


@pytest.mark.parametrize("attack", ["gambler", "bitflip", "omniscient"])
def test_proxy_refuses_bad_push_rows_and_keeps_relaying(processes, peers, tmp_path,
                                                        attack: str) -> None:
    server_proc, server = start_server(processes, tmp_path)
    proxy_proc, proxy = start_proxy(processes, tmp_path, server, attack)
    peer = peers(proxy)
    size = shard_size(peer)
    good = np.zeros(size, dtype=np.float32)
    hostile = {
        ErrorCode.UNKNOWN_WORKER: [push(0, -1, good), push(0, CFG.num_workers, good)],
        ErrorCode.STALE_ROUND: [push(-1, 0, good)],
        # one value; and a whole round of unequal lengths, which an attack that stacks
        # the round's pushes (omniscient) cannot take
        ErrorCode.WRONG_LENGTH: [push(0, 0, np.zeros(1, np.float32)),
                                 *[push(0, w, np.zeros(size + 1 + w, np.float32))
                                   for w in range(CFG.num_workers)]],
    }
    for code, messages in hostile.items():
        assert_errors(peer.ask_all(messages), code)
    assert proxy_proc.running and server_proc.running
    assert isinstance(peer.ask(status()), StatusReply)  # still relaying
    workers = start_workers(processes, proxy, [ALL])
    finish(processes, [proxy_proc, server_proc], workers)


# -- 3. a flood of future-round pushes to a proxy that holds rounds ----------------------


def test_future_round_pushes_are_refused_not_held_by_an_omniscient_proxy(
        processes, peers, tmp_path) -> None:
    _, server = start_server(processes, tmp_path, LONG)
    proxy_proc, proxy = start_proxy(processes, tmp_path, server, "omniscient", LONG)
    peer = peers(proxy)
    values = np.ones(shard_size(peer, LONG), dtype=np.float32)
    limit_mb = 30
    flood = 600
    # held, these pushes would take 600 x the shard (about 280 MB for the MLP)
    assert flood * values.nbytes / MB > 5 * limit_mb
    assert_errors(peer.ask_all([push(r, 0, values) for r in range(700, 710)]),
                  ErrorCode.WRONG_ROUND)  # warm-up: buffers every message needs
    baseline = reset_peak(proxy_proc)
    replies = peer.ask_all([push(r, r % LONG.num_workers, values)
                            for r in range(2, 2 + flood)])
    assert_errors(replies, ErrorCode.WRONG_ROUND)
    growth = memory_mb(proxy_proc)["VmHWM"] - baseline
    assert growth < limit_mb, f"proxy peak RSS grew {growth:.0f} MB"
    assert proxy_proc.running and isinstance(peer.ask(status()), StatusReply)


# -- 4. routing frames larger than any routing id -----------------------------------------


def big_envelope(frames: list[bytes]) -> list[bytes]:
    """``frames`` (which start with the delimiter) behind a 100 KB routing frame."""
    return [b"x" * 100_000, *frames]


def test_large_routing_frames_are_refused_and_not_kept(processes, peers, tmp_path) -> None:
    assert MAX_ROUTING_ID_BYTES < 100_000
    server_proc, server = start_server(processes, tmp_path)
    proxy_proc, proxy = start_proxy(processes, tmp_path, server, "gambler")
    limit_mb = 30
    for node, endpoint, messages in [
        (proxy_proc, proxy, [big_envelope([b"", *encode(Pull(round=-1, worker=0))])] * 50),
        (server_proc, server, [big_envelope(hello())] * 50
         + [big_envelope([b"", *encode(Pull(round=1, worker=-1))])] * 30),
    ]:
        peer = peers(endpoint)
        assert isinstance(peer.ask(status()), StatusReply)  # warm-up
        baseline = reset_peak(node)
        # each refused, answered on the first routing frame (the peer's own identity)
        assert_errors(peer.ask_all(messages), ErrorCode.MALFORMED)
        growth = memory_mb(node)["VmHWM"] - baseline
        assert growth < limit_mb, f"{node.name} peak RSS grew {growth:.0f} MB"
        reply = peer.ask(status())
        assert isinstance(reply, StatusReply) and reply.round == 0
    assert reply.counters[ErrorCode.MALFORMED.value] == 80  # the server's own count


# -- 5. one peer parking PULLs -------------------------------------------------------------


def _counters_when(peer: RawPeer, condition) -> dict | None:
    """The node's STATUS counters if ``condition`` holds for them, else None."""
    status_reply = peer.ask(status())
    assert isinstance(status_reply, StatusReply), status_reply
    return status_reply.counters if condition(status_reply.counters) else None


def test_one_peer_cannot_fill_the_parking_for_the_others(processes, peers, tmp_path) -> None:
    assert CFG.rounds > MAX_PARKED_PER_PEER
    server_proc, server = start_server(processes, tmp_path)
    greedy, other = peers(server), peers(server)
    shard_size(greedy)
    shard_size(other)
    # 4,100 PULLs for the future rounds 1..R in turn: the first MAX_PARKED_PER_PEER
    # rounds are parked (a repeat replaces its round's entry), every other one is BUSY
    # (answered within the peer's refusal budget, the rest dropped unanswered)
    pulls = [1 + i % CFG.rounds for i in range(4100)]
    busy = sum(r > MAX_PARKED_PER_PEER for r in pulls)
    for round_ in pulls:
        greedy.send([b"", *encode(Pull(round=round_, worker=-1))])
    counters = wait_for(lambda: _counters_when(other, lambda c: c.get("busy") == busy), 60,
                        "every BUSY counted")
    replies = []
    while greedy.sock.poll(500):
        replies.append(decode(greedy.sock.recv_multipart()[1:]).header)
    assert_errors(replies, ErrorCode.BUSY)
    assert 200 <= len(replies) < busy and counters["unanswered"] == busy - len(replies)
    other.send([b"", *encode(Pull(round=1, worker=-1))])
    assert other.quiet(0.3)  # parked, not refused
    workers = start_workers(processes, server, [ALL])
    finish(processes, [server_proc], workers)
    [params] = other.replies(1)
    assert isinstance(params, Params) and params.round == 1
    answered = greedy.replies(MAX_PARKED_PER_PEER)
    assert all(isinstance(p, Params) for p in answered), answered
    assert sorted(p.round for p in answered) == list(range(1, MAX_PARKED_PER_PEER + 1))
    assert greedy.quiet(0.3)  # each parked round answered once


# -- 6. a message of 500 MB in legal-sized frames -----------------------------------------


def send_huge_push(peer: RawPeer, frame: bytes, count: int) -> None:
    """A PUSH header announcing ``count`` frames of ``frame``, then those frames (the same
    buffer each time, not copied)."""
    header = msgpack.packb({"v": PROTOCOL_VERSION, "op": int(Op.PUSH), "round": 0,
                            "worker": 0, "length": count * len(frame) // 4})
    peer.sock.send_multipart([b"", header], flags=zmq.SNDMORE)
    for i in range(count):
        peer.sock.send(frame, copy=False, flags=zmq.SNDMORE if i < count - 1 else 0)


def test_a_500_mb_push_is_cut_while_in_flight_and_never_held(processes, peers,
                                                             tmp_path) -> None:
    """libzmq hands a multipart message over only once all of it is in; the in-flight
    guard (``common/net/inflight.py``) cuts the connection once it holds more than a few
    legal messages' worth, so the node never holds the 500 MB (it once held all of it
    until it could refuse it)."""
    server_proc, server = start_server(processes, tmp_path)
    proxy_proc, proxy = start_proxy(processes, tmp_path, server, "gambler")
    frame, count = b"\x00" * CHUNK_BYTES, 125
    for node, endpoint in [(server_proc, server), (proxy_proc, proxy)]:
        peer = peers(endpoint)
        assert isinstance(peer.ask(status()), StatusReply)  # warm-up
        baseline = reset_peak(node)
        send_huge_push(peer, frame, count)
        assert peer.quiet(5.0)  # cut: no reply, nothing delivered
        memory = memory_mb(node)
        assert memory["VmHWM"] - baseline < 100, (node.name, memory, baseline)
        assert node.running and isinstance(peers(endpoint).ask(status()), StatusReply)
        assert "cut a connection" in log_text(node)


# -- 7. connections that take every descriptor --------------------------------------------


def _saved_round(out: Path) -> int:
    """The round of the (insecure) server's checkpoint, once it checks out."""
    return read_run_checkpoint(out, CFG, 0, None, finite=False).round


def checkpointing_server_with_raw_worker(processes: Processes, peers, tmp_path: Path
                                         ) -> tuple[ManagedProcess, str, RawPeer, int]:
    """A server checkpointing every round and a raw peer that said HELLO as worker 1
    (it decides when rounds end); the server's process, endpoint, the peer, shard size."""
    server_proc, server = start_server(processes, tmp_path, CFG, "--checkpoint-every", "1")
    raw = peers(server)
    assert isinstance(raw.ask(hello("worker", 1)), Welcome)
    return server_proc, server, raw, shard_size(peers(server))


def test_descriptor_exhaustion_fails_checkpoints_not_the_server(processes, peers,
                                                                tmp_path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 400:
        pytest.skip(f"this process may open {hard} files; the test needs 400")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out = tmp_path / "out"
    # worker 1 is the raw peer until the descriptors are back: it decides when rounds end
    server_proc, server, raw, size = checkpointing_server_with_raw_worker(processes, peers,
                                                                          tmp_path)
    pid = server_proc.pid
    [worker0] = start_workers(processes, server, [0])
    assert raw.ask(push(0, 1, np.zeros(size, np.float32))).round == 0
    wait_for(lambda: checkpoint_path(out, 0).exists(), 60, "the checkpoint of round 1")

    host, port = server.removeprefix("tcp://").rsplit(":", 1)
    base = open_files(server_proc)
    # a descriptor limit the server reaches with connections that never start a
    # handshake, within the guard's bounds on those (per source address and in all)
    limit = base + 120
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    idle: list[socket.socket] = []
    try:
        # in batches the server accepts before the next (a full accept queue drops the
        # handshake's last ACK, and an idle client would never know)
        while len(idle) < 200:
            for _ in range(50):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                idle.append(s)
                s.bind((f"127.0.0.{2 + len(idle) % 4}", 0))
                s.setblocking(False)
                code = s.connect_ex((host, int(port)))
                assert code in (0, errno.EINPROGRESS), os.strerror(code)
            wanted = min(limit, base + len(idle))
            wait_for(lambda n=wanted: open_files(server_proc) >= n, 30,
                     f"the server to hold {wanted} descriptors")
        assert raw.ask(push(1, 1, np.zeros(size, np.float32))).round == 1
        wait_for(lambda: "checkpoint of round 2" in log_text(server_proc), 30,
                 "the failed checkpoint of round 2 to be logged")
        assert server_proc.running
    finally:
        for s in idle:
            s.close()
    wait_for(lambda: open_files(server_proc) < 200, 30, "the server to close the connections")
    status_reply = raw.ask(status())
    assert isinstance(status_reply, StatusReply)
    assert status_reply.counters["checkpoint-failed"] >= 1
    assert "failed" in log_text(server_proc).split("checkpoint of round 2", 1)[1][:300]
    [worker1] = start_workers(processes, server, [1])
    finish(processes, [server_proc], [worker0, worker1])
    assert _saved_round(out) == CFG.rounds
    assert not list(out.glob("*.tmp"))


# -- 8. the disk fills during a checkpoint ------------------------------------------------


def test_a_checkpoint_past_the_file_size_limit_fails_and_the_next_succeeds(
        processes, peers, tmp_path) -> None:
    out = tmp_path / "out"
    server_proc, server, raw, size = checkpointing_server_with_raw_worker(processes, peers,
                                                                          tmp_path)
    pid = server_proc.pid
    limit = 64 * 1024  # below the checkpoint; above the log and metrics files
    assert 4 * size > limit
    [worker0] = start_workers(processes, server, [0])
    previous = resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    assert server_proc.log_path.stat().st_size < limit // 2
    assert raw.ask(push(0, 1, np.zeros(size, np.float32))).round == 0
    wait_for(lambda: "checkpoint of round 1" in log_text(server_proc), 30,
             "the failed checkpoint of round 1 to be logged")
    assert "failed" in log_text(server_proc).split("checkpoint of round 1", 1)[1][:300]
    assert not checkpoint_path(out, 0).exists() and not list(out.glob("*.tmp"))

    resource.prlimit(pid, resource.RLIMIT_FSIZE, previous)
    assert raw.ask(push(1, 1, np.zeros(size, np.float32))).round == 1
    wait_for(lambda: checkpoint_path(out, 0).exists(), 30, "the checkpoint of round 2")
    assert _saved_round(out) == 2
    assert server_proc.running
    [worker1] = start_workers(processes, server, [1])
    finish(processes, [server_proc], [worker0, worker1])
    assert _saved_round(out) == CFG.rounds
    assert not list(out.glob("*.tmp"))
