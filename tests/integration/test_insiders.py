"""Byzantine insiders through real processes: a key holder cannot impersonate beyond its
scope, exhaust a server's memory or disk, or make every round wait for a worker that is
gone."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from common.conf.settings import SERVER, to_argv
from common.net.keys import KeyRing, create_keys
from common.net.protocol import Error, Hello, Pull, Push, Status, Welcome, decode, encode
from common.net.transport import connect_dealer
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from ps.reference.engine import simulate
from ps.reference.participation import read_participation
from server.checkpoint import final_parameters, params_digest
from tests.integration.conftest import handshake_refused, wait_for, watched_dealer

pytestmark = pytest.mark.integration

CFG = RunConfig(dataset="synthetic", num_workers=6, num_shards=2, rule="marmed", q=1,
                rounds=40, seed=4).validate()
DEADLINE_S = 2.0
QUORUM = ["--round-timeout", str(DEADLINE_S), "--quorum", "5"]
CFG_SHARD_LENGTH = 64  # any length: the push is refused before its values are read
PUSHED = np.full(CFG_SHARD_LENGTH, 1e6, dtype=np.float32)


def start_servers(processes, out: Path, keys: Path, *extra: str) -> list[str]:
    endpoints = []
    for s in range(CFG.num_shards):
        ready = out / f"server-{s}.endpoint"
        proc = processes.start(f"server-{s}", "server.cli", [
            "--shard", str(s), "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
            "--out-dir", str(out), "--linger", "0", "--keys", str(keys),
            "--log-file", str(out / f"server-{s}.log"), *extra, *to_argv(CFG, SERVER)])
        endpoints.append(processes.endpoint(ready, proc))
    return endpoints


def start_workers(processes, endpoints: list[str], keys: Path, teams: list[str]) -> list:
    """A worker process per team (``--worker-id``: ``0-5`` runs six workers in one
    process, each with its own key and connections: one interpreter to start, not six)."""
    return [processes.start(f"workers-{team}", "worker.cli", [
        "--servers", ",".join(endpoints), "--worker-id", team, "--timeout", "30",
        "--keys", str(keys), *to_argv(CFG, SERVER)]) for team in teams]


def ask(sock: zmq.Socket, frames: list) -> object:
    sock.send_multipart([b"", *frames])
    assert sock.poll(10_000), "no reply"
    return decode(sock.recv_multipart()[1:]).header


def test_a_proxy_key_is_refused_by_the_servers_it_does_not_front(processes, tmp_path) -> None:
    keys = tmp_path / "keys"
    create_keys(keys, CFG.num_shards, CFG.num_workers, proxies=(0,))
    endpoints = start_servers(processes, tmp_path, keys)
    ring = KeyRing(keys)
    ctx = zmq.Context.instance()
    hello = encode(Hello(role="proxy", worker=-1, config_hash=CFG.config_hash))
    # at shard 1 (no proxy in front): no connection at all, whatever it would say
    other = watched_dealer(ctx, endpoints[1], ring.client_curve("proxy-0", 1))
    try:
        assert handshake_refused(other)
    finally:
        other.close(0)
    # at shard 0, the one it fronts: it may say HELLO as the proxy itself ...
    own = connect_dealer(ctx, endpoints[0], 0, ring.client_curve("proxy-0", 0))
    try:
        assert isinstance(ask(own, hello), Welcome)
        # ... but not speak for a worker on its own connection (only relayed)
        as_worker = Hello(role="worker", worker=3, config_hash=CFG.config_hash)
        reply = ask(own, encode(as_worker))
        assert isinstance(reply, Error) and reply.code == "forbidden"
    finally:
        own.close(0)


def test_a_stolen_proxy_key_cannot_invent_workers_at_the_server_it_fronts(
        processes, tmp_path) -> None:
    """Issue 35: proxy-0's key connected straight to server-0 with a made-up envelope
    frame before the delimiter, as each worker: no HELLO or push is accepted (before,
    the server opened sessions as all of them and acknowledged the invented pushes), and
    the honest workers then run the whole run."""
    keys = tmp_path / "keys"
    create_keys(keys, CFG.num_shards, CFG.num_workers, proxies=(0,))
    endpoints = start_servers(processes, tmp_path, keys)
    ring = KeyRing(keys)
    thief = connect_dealer(zmq.Context.instance(), endpoints[0], 0,
                           ring.client_curve("proxy-0", 0))
    try:
        for w in range(CFG.num_workers):
            route = b"invented-%d" % w
            for header, values in (
                    (Hello(role="worker", worker=w, config_hash=CFG.config_hash), None),
                    (Push(round=0, worker=w, length=CFG_SHARD_LENGTH), PUSHED)):
                thief.send_multipart([route, b"", *encode(header, values)])
                assert thief.poll(10_000), "no reply"
                frames = thief.recv_multipart()
                assert frames[0] == route
                reply = decode(frames[2:]).header
                assert isinstance(reply, Error) and reply.code in ("forbidden", "hello-first")
    finally:
        thief.close(0)
    (workers,) = start_workers(processes, endpoints, keys, [f"0-{CFG.num_workers - 1}"])
    assert processes.wait_exit(workers, 120) == 0, workers.tail()
    rounds = read_jsonl(tmp_path / "server-0.jsonl")
    assert [r["round"] for r in rounds] == list(range(CFG.rounds))
    assert all(r["params_finite"] and not r["missing"] for r in rounds)


def test_a_killed_worker_costs_one_deadline_not_one_per_round(processes, tmp_path) -> None:
    keys = tmp_path / "keys"
    create_keys(keys, CFG.num_shards, CFG.num_workers)
    endpoints = start_servers(processes, tmp_path, keys, *QUORUM)
    others, killed = start_workers(processes, endpoints, keys, ["0-3,5", "4"])
    wait_for(lambda: len(read_jsonl(tmp_path / "server-0.jsonl")) >= 5, 120, "round 5")
    killed.process.send_signal(signal.SIGKILL)
    killed_at = len(read_jsonl(tmp_path / "server-1.jsonl"))  # (the slower shard's round)
    assert processes.wait_exit(others, 120) == 0, others.tail()
    for s in range(CFG.num_shards):
        rounds = read_jsonl(tmp_path / f"server-{s}.jsonl")
        assert [r["round"] for r in rounds] == list(range(CFG.rounds))
        after = [r for r in rounds if 4 in r["missing"]]
        closed = [r["closed"] for r in after]
        # the round the kill fell in waits for its deadline; every later one closes as
        # soon as the five others are in
        assert closed[0] == "deadline" and set(closed[1:]) == {"present"}, closed
        assert len(after) >= CFG.rounds - killed_at - 2  # every round from the kill on
    replay = read_participation(tmp_path, CFG.num_shards, CFG.num_workers, CFG.rounds)
    import torch

    torch.set_num_threads(1)
    reference = simulate(CFG, AttackConfig(), participation=replay)
    ring = KeyRing(keys)
    assert reference.digest == params_digest(final_parameters(tmp_path, CFG, ring))


def test_a_key_holders_flood_of_refused_messages_is_budgeted(processes, tmp_path) -> None:
    """3,000 refused messages, among them 65 KB undecodable headers: the replies stop at
    the key's rate and the server's log stays a few lines long."""
    keys = tmp_path / "keys"
    create_keys(keys, CFG.num_shards, CFG.num_workers)
    endpoints = start_servers(processes, tmp_path, keys)
    thief = connect_dealer(zmq.Context.instance(), endpoints[0], 0,
                           KeyRing(keys).client_curve("worker-2", 0))
    thief.setsockopt(zmq.SNDHWM, 10_000)
    replies = 0
    try:
        started = time.monotonic()
        for i in range(3000):
            junk = b"\xc1" + b"x" * (65_000 if i % 10 == 0 else 100)
            thief.send_multipart([b"", junk])
        # the server has read them all once its STATUS says so (one connection, in order)
        while True:
            errors, counters = _status_after(thief)
            replies += errors
            if counters.get("malformed", 0) >= 3000:
                break
            assert time.monotonic() - started < 60, "3,000 refusals not read in 60 s"
        elapsed = time.monotonic() - started
        while thief.poll(200):  # late replies
            thief.recv_multipart()
            replies += 1
    finally:
        thief.close(0)
    assert 200 <= replies <= 200 + 100 * elapsed + 50  # the burst, then 100/s
    log = (tmp_path / "server-0.log").read_text()
    refusal_lines = [line for line in log.splitlines() if "refused a message" in line]
    assert 1 <= len(refusal_lines) <= 1 + elapsed / 10 + 1
    assert max(len(line) for line in log.splitlines()) < 1000
    assert len(log) < 20_000


def _status_after(sock: zmq.Socket) -> tuple[int, dict]:
    """Ask the server's STATUS: (ERROR replies read before its answer, its counters)."""
    sock.send_multipart([b"", *encode(Status())])
    errors = 0
    while sock.poll(10_000):
        header = decode(sock.recv_multipart()[1:]).header
        if not isinstance(header, Error):
            return errors, header.counters
        errors += 1
    pytest.fail("no STATUS reply")


def test_an_over_long_message_gets_its_key_barred_and_the_run_goes_on(processes,
                                                                       tmp_path) -> None:
    """Worker 5's key holder sends messages of 2 GB in 4 MiB frames, again and again; the
    server cuts the first while it holds a few MB of it, bars the key (no connection of it
    is admitted again), and the five honest workers finish the run with a quorum of 5,
    bit-identical to the reference engine replaying who took part."""
    keys = tmp_path / "keys"
    create_keys(keys, CFG.num_shards, CFG.num_workers)
    endpoints = start_servers(processes, tmp_path, keys, *QUORUM)
    server = next(p for p in processes.started if p.name == "server-0")
    (workers,) = start_workers(processes, endpoints, keys, ["0-4"])
    wait_for(lambda: len(read_jsonl(tmp_path / "server-0.jsonl")) >= 3, 120, "round 3")
    baseline = _rss_mb(server.pid)
    ctx = zmq.Context()
    ring = KeyRing(keys)
    chunk = b"\0" * (4 << 20)
    peak, connections = baseline, 0
    try:
        thief = connect_dealer(ctx, endpoints[0], 0, ring.client_curve("worker-5", 0))
        monitor = thief.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        thief.send_multipart([b"", *encode(Status())])
        for _ in range(3):
            with contextlib.suppress(zmq.Again):
                thief.send_multipart([b"", *[chunk] * 512], copy=False, flags=zmq.NOBLOCK)
        # until a reconnection of it (libzmq retries by itself) has been refused, or the
        # run has ended (on a loaded host the honest workers may finish their rounds
        # while the 2 GB is still being sent; no connection was admitted until then)
        refused, deadline = 0, time.monotonic() + 60
        while not refused and server.returncode is None:
            assert time.monotonic() < deadline, "the barred key's reconnections not refused"
            peak = max(peak, _rss_mb(server.pid))
            if monitor.poll(20):
                event = recv_monitor_message(monitor)["event"]
                connections += event == zmq.EVENT_HANDSHAKE_SUCCEEDED
                refused += event == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        thief.disable_monitor()
        monitor.close(0)
        thief.close(0)
    finally:
        ctx.destroy(0)
    assert processes.wait_exit(workers, 180) == 0, workers.tail()
    assert connections == 1  # the first; never one after the offence
    assert peak - baseline < 150, (baseline, peak)
    lines = read_jsonl(tmp_path / "server-0.jsonl")
    assert lines[-1]["barred"] == ["worker-5"] and len(lines) == CFG.rounds
    assert "barred worker-5" in (tmp_path / "server-0.log").read_text()
    replay = read_participation(tmp_path, CFG.num_shards, CFG.num_workers, CFG.rounds)
    import torch

    torch.set_num_threads(1)
    reference = simulate(CFG, AttackConfig(), participation=replay)
    assert reference.digest == params_digest(final_parameters(tmp_path, CFG, ring))


def test_a_resumed_insecure_run_never_runs_insecure_unless_told(tmp_path) -> None:
    """The run directory's saved command says --insecure; a resume whose own command line
    does not say it refuses, before starting anything, naming what to do."""
    from click.testing import CliRunner

    from common.errors import EXIT_CONFIG
    from ps.launcher.cli import main as cluster_main

    out = tmp_path / "run"
    args = ["--dataset", "synthetic", "--workers", "2", "--shards", "1", "--rule", "mean",
            "--q", "0", "--rounds", "2", "--out-dir", str(out), "--no-evaluator",
            "--insecure"]
    assert CliRunner().invoke(cluster_main, args).exit_code == 0
    resumed = CliRunner().invoke(cluster_main, ["--resume", str(out)])
    assert resumed.exit_code == EXIT_CONFIG
    assert "resume it with --insecure" in resumed.output
    assert not (out / "keys").exists()  # nothing was started or generated


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cnn_server(processes, tmp_path: Path, cfg: RunConfig, keys: Path):
    """A keyed server of ``cfg`` (one shard; the CNN's, or any) whose rounds close with 3
    of its 4 workers."""
    ready = tmp_path / "server.endpoint"
    server = processes.start("server-0", "server.cli", [
        "--shard", "0", "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
        "--out-dir", str(tmp_path), "--linger", "0", "--keys", str(keys),
        "--round-timeout", "1", "--quorum", "3", *to_argv(cfg, SERVER)])
    return server, processes.endpoint(ready, server)


def _plain_proxy(processes, tmp_path: Path, cfg: RunConfig, keys: Path, endpoint: str):
    """proxy-0 in front of ``endpoint``, corrupting nothing (a gambler of p = 0), and the
    endpoint where the workers reach it."""
    ready = tmp_path / "proxy.endpoint"
    proxy = processes.start("proxy-0", "ps.proxy.cli", [
        "--bind", "tcp://127.0.0.1:*", "--server", endpoint, "--shard", "0",
        "--proxy-attack", "gambler", "--gambler-p", "0.0", "--out-dir", str(tmp_path),
        "--ready-file", str(ready), "--keys", str(keys), *to_argv(cfg, SERVER)])
    return proxy, processes.endpoint(ready, proxy)


def _silent(ctx: zmq.Context, endpoint: str, curve, hello: list, count: int = 3) -> list:
    """``count`` connections of one key that say HELLO and read nothing after (RCVHWM 1,
    a 4 KB receive buffer): what the node queues for them stays with the node."""
    socks = []
    for _ in range(count):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_secretkey, sock.curve_publickey = curve.secret, curve.public
        sock.curve_serverkey = curve.server
        sock.connect(endpoint)
        sock.send_multipart([b"", *hello])
        socks.append(sock)
    return socks


def _pull_every_round(watcher: zmq.Socket, socks: list, until: int) -> None:
    """On each of ``socks``, PULL each new round (the watcher's STATUS says which) until
    round ``until``."""
    pulled = -1
    while (current := ask(watcher, encode(Status())).round) < until:
        if current != pulled:
            for sock in socks:  # asked for, never read
                sock.send_multipart([b"", *encode(Pull(round=current, worker=0))])
            pulled = current
        time.sleep(0.05)


def test_replies_a_key_never_reads_are_bounded_by_bytes(processes, tmp_path) -> None:
    """Issue 35: one worker key, 3 connections that PULL each round and never read (cnn,
    7.8 MB a reply): the server held every unread reply's round (RSS 257 -> 727 MiB);
    now the key's large replies beyond REPLIES_HELD are dropped and counted."""
    cfg = RunConfig(dataset="synthetic", model="cnn", num_workers=4, num_shards=1, q=1,
                    rounds=16, seed=2).validate()
    keys = tmp_path / "keys"
    create_keys(keys, 1, cfg.num_workers)
    server, endpoint = _cnn_server(processes, tmp_path, cfg, keys)
    workers = [processes.start(f"worker-{i}", "worker.cli", [
        "--servers", endpoint, "--worker-id", str(i), "--timeout", "30", "--keys", str(keys),
        *to_argv(cfg, SERVER)]) for i in (1, 2, 3)]
    ring = KeyRing(keys)
    ctx = zmq.Context.instance()
    watcher = connect_dealer(ctx, endpoint, 0, ring.client_curve("evaluator", 0))
    hello = encode(Hello(role="worker", worker=0, config_hash=cfg.config_hash))
    silent = _silent(ctx, endpoint, ring.client_curve("worker-0", 0), hello)
    try:
        wait_for(lambda: ask(watcher, encode(Status())).round >= 3, 120, "round 3")
        before = _rss_mb(server.pid)
        _pull_every_round(watcher, silent, cfg.rounds - 2)
        grown = _rss_mb(server.pid) - before
        counters = ask(watcher, encode(Status())).counters
    finally:
        for sock in [watcher, *silent]:
            sock.close(0)
    for worker in workers:
        assert processes.wait_exit(worker, 240) == 0, worker.tail()
    # 3 connections x ~11 rounds x 7.8 MB unread before; now at most REPLIES_HELD replies
    assert grown < 150, f"server RSS grew {grown:.0f} MiB"
    assert counters.get("unread-replies", 0) > 0, (counters, grown)


def test_replies_a_key_never_reads_at_a_proxy_are_bounded_by_bytes(processes, tmp_path) -> None:
    """The same at a proxy (a node too): worker-0's key, 3 connections to the proxy that
    PULL every round through it and never read; the proxy drops the large replies beyond
    its budget and counts them."""
    from common.net.relay_auth import hello_tag, new_nonce

    cfg = RunConfig(dataset="synthetic", model="cnn", num_workers=4, num_shards=1, q=1,
                    rounds=16, seed=2).validate()
    keys = tmp_path / "keys"
    create_keys(keys, 1, cfg.num_workers, proxies=(0,))
    _, endpoint = _cnn_server(processes, tmp_path, cfg, keys)
    proxy, front = _plain_proxy(processes, tmp_path, cfg, keys, endpoint)
    workers = [processes.start(f"worker-{i}", "worker.cli", [
        "--servers", front, "--via-proxy", "0", "--worker-id", str(i), "--timeout", "30",
        "--keys", str(keys), *to_argv(cfg, SERVER)]) for i in (1, 2, 3)]
    ring = KeyRing(keys)
    ctx = zmq.Context.instance()
    watcher = connect_dealer(ctx, endpoint, 0, ring.client_curve("evaluator", 0))
    nonce = new_nonce()
    hello = encode(Hello(role="worker", worker=0, config_hash=cfg.config_hash, nonce=nonce,
                         tag=hello_tag(ring.worker_relay_key(0, 0), cfg.config_hash, 0, 0,
                                       nonce)))
    silent = _silent(ctx, front, ring.client_curve("worker-0", 0, via_proxy=True), hello)
    try:
        _pull_every_round(watcher, silent, cfg.rounds - 2)
    finally:
        for sock in [watcher, *silent]:
            sock.close(0)
    for worker in workers:
        assert processes.wait_exit(worker, 240) == 0, worker.tail()
    assert processes.wait_exit(proxy, 60) == 0, proxy.tail()
    counters = read_jsonl(tmp_path / "proxy-0.jsonl")[-1]["counters"]
    assert counters.get("unread-replies", 0) > 0, counters


def test_a_worker_padding_a_relayed_push_cannot_get_the_proxys_key_barred(processes,
                                                                           tmp_path) -> None:
    """Worker-0's key holder, through the proxy, pushes an old round (which the proxy
    relays as it came) padded with empty frames up to the largest message a node takes.
    The server adds the proxy connection's routing id to what comes from it: before, that
    took the message past the server's limit, the server barred proxy-0's key, and no
    worker behind the proxy reached it again. The proxy now takes one hop less: it bars
    worker-0's key itself, and the three honest workers finish the run."""
    from common.net.relay_auth import hello_tag, new_nonce
    from common.net.transport import FRAME_COST, largest_message

    cfg = RunConfig(dataset="synthetic", num_workers=4, num_shards=1, q=1, rounds=12,
                    seed=3).validate()
    keys = tmp_path / "keys"
    create_keys(keys, 1, cfg.num_workers, proxies=(0,))
    server, endpoint = _cnn_server(processes, tmp_path, cfg, keys)
    proxy, front = _plain_proxy(processes, tmp_path, cfg, keys, endpoint)
    ring = KeyRing(keys)
    ctx = zmq.Context.instance()
    thief = connect_dealer(ctx, front, 0, ring.client_curve("worker-0", 0, via_proxy=True))
    watcher = connect_dealer(ctx, endpoint, 0, ring.client_curve("evaluator", 0))
    try:
        nonce = new_nonce()
        welcome = ask(thief, encode(Hello(
            role="worker", worker=0, config_hash=cfg.config_hash, nonce=nonce,
            tag=hello_tag(ring.worker_relay_key(0, 0), cfg.config_hash, 0, 0, nonce))))
        assert isinstance(welcome, Welcome)
        workers = [processes.start(f"worker-{i}", "worker.cli", [
            "--servers", front, "--via-proxy", "0", "--worker-id", str(i), "--timeout", "30",
            "--keys", str(keys), *to_argv(cfg, SERVER)]) for i in (1, 2, 3)]
        wait_for(lambda: ask(watcher, encode(Status())).round >= 2, 120, "round 2")
        # round 0, relayed as it came (the proxy's round is past it); the proxy's ROUTER
        # adds a routing frame of 5 bytes in front: pad to the largest message there
        body = encode(Push(round=0, worker=0, length=welcome.length),
                      np.zeros(welcome.length, np.float32))
        cost = sum(len(f) + FRAME_COST for f in [b"12345", b"", *body])
        padding = (largest_message(welcome.length) - cost) // FRAME_COST
        thief.send_multipart([b"", *body, *[b""] * padding])
        for worker in workers:
            assert processes.wait_exit(worker, 120) == 0, worker.tail()
    finally:
        thief.close(0)
        watcher.close(0)
    assert processes.wait_exit(server, 60) == 0, server.tail()
    assert processes.wait_exit(proxy, 60) == 0, proxy.tail()
    rounds = read_jsonl(tmp_path / "server-0.jsonl")
    assert [r["round"] for r in rounds] == list(range(cfg.rounds))
    assert rounds[-1]["barred"] == []
    proxy_log = read_jsonl(tmp_path / "proxy-0.jsonl")[-1]
    assert proxy_log["counters"].get("too-large", 0) == 1, proxy_log
