"""A real cluster across network namespaces with latency, loss and a bandwidth cap.

Method. Every node of the cluster gets a network namespace of its own (server 0,
server 1, the proxy in front of shard 0, and two groups of 3 workers, each group one
worker process running its team: ``--worker-id 0-2``), joined by veth pairs to a Linux
bridge that lives in one more namespace (never the root namespace: nothing leaves the
machine), with addresses 10.R.R.x/24 and names unique to the test run (interfaces at
most 15 characters). The links are then degraded with what this
kernel has (it has no netem):

* loss: ``iptables -A INPUT ! -i lo -m statistic --mode random --probability 0.01 -j DROP``
  in every node's namespace (1 % of the packets a node receives from the bridge);
* bandwidth: a ``tbf`` qdisc on both ends of server 1's link (each direction capped);
* latency: ``scripts/delay_relay.py`` processes inside each worker group's namespace,
  one per shard, relaying the group's connections to the servers (and the proxy) with
  20 ms +- 5 ms one-way delay per direction, in order within a connection; the group's
  workers connect to their relays on the namespace's loopback.

The processes are real and started as a deployment starts them, with ``ip netns exec NS
python -m server.cli|ps.proxy.cli|worker.cli``, each with the flags the launcher builds
(``Cluster.server_argv``/``proxy_argv``/``worker_argv``) and the keys of ``ps-keys``;
servers and proxy bind ``tcp://10.R.R.x:*`` and announce the port they got in a ready
file. Half-way through, group A's relay to the proxy is killed and started again on its
port: its connections reset, and what was in flight on them must be sent again. The
run must finish (every process exits 0 within a deadline) and its final
parameters (the servers' shard files) must be bit-identical to the in-process reference
engine ``simulate(cfg, attack)``, which applies the proxy's gambler corruption itself,
with the participation the servers recorded (as ``ps-cluster --verify`` does). The test
also checks that the degradation happened: packets dropped by the iptables rules, the
bandwidth cap's queue overlimits, and the relays' delay in the workers' exchange times.

Everything (processes, then namespaces, with their veths, bridge and iptables rules) is
torn down whatever the outcome. Needs root, ``ip netns`` and an iptables binary
(Debian's package ``iptables``); skipped with the reason otherwise.

The other tests here need no root: the relay itself (delay, order, close), and what the
relays revealed in the client (``worker/client.py``): a worker whose server is not up yet
behind a relay (the CURVE handshake fails with no detail, as with an impostor) waits for
it instead of exiting 3, and a connection lost with a push in flight is resent at once
instead of after the request timeout (60 s by default).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from common.conf.settings import SERVER, to_argv
from common.net.keys import KeyRing, SecurityOptions
from common.net.protocol import Status, StatusReply, decode, encode
from common.net.transport import connect_dealer
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import read_jsonl
from ps.launcher.cluster import CHILD_ENV, Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.launcher.processes import ManagedProcess, stop_all
from ps.reference.engine import simulate
from ps.reference.participation import read_participation
from server.checkpoint import final_parameters, params_digest
from tests.integration.conftest import wait_for

RELAY = Path(__file__).resolve().parents[2] / "scripts" / "delay_relay.py"
LOSS = 0.01
DELAY_MS, JITTER_MS = 20, 5
RATE = "40mbit"  # server 1's link, each direction
READY_S = 60.0
RUN_DEADLINE_S = 150.0
IP_TIMEOUT_S = 20.0


def _iptables() -> str | None:
    """An iptables binary (nft or legacy backend), or None."""
    return next((b for b in ("iptables", "iptables-nft", "iptables-legacy") if shutil.which(b)),
                None)


def _unavailable() -> str | None:
    """Why the test cannot run here, or None."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs root on Linux (network namespaces, veth, bridge, iptables, tc)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    if _iptables() is None:
        return "needs an iptables binary for the 1 % loss (Debian package iptables)"
    probe = f"bzprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          timeout=IP_TIMEOUT_S)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=IP_TIMEOUT_S)
    return None


UNAVAILABLE = _unavailable()
pytestmark = pytest.mark.integration


def sh(*argv: str) -> str:
    """Run a command; its stdout, or an AssertionError with its stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Node:
    """A host of the test network: its namespace, address and veth ends."""

    name: str
    ns: str
    ip: str
    inside: str  # the veth end in the node's namespace
    outside: str  # its peer, a port of the bridge


@dataclass
class Lab:
    """A bridge in a namespace of its own and one namespace per node; torn down whole."""

    tag: str
    subnet: str  # "10.R.R"
    log_dir: Path
    namespaces: list[str] = field(default_factory=list)
    nodes: dict[str, Node] = field(default_factory=dict)
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"{self.tag}br"

    def _add_ns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def build_bridge(self) -> None:
        self._add_ns(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "name", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")

    def add_node(self, name: str) -> Node:
        """A namespace with one veth into the bridge and the next address of the subnet."""
        ns = f"{self.tag}{name}"
        self._add_ns(ns)
        node = Node(name, ns, f"{self.subnet}.{len(self.nodes) + 2}",
                    inside=f"{self.tag}{name}n", outside=f"{self.tag}{name}b")
        sh("ip", "-n", self.hub, "link", "add", node.outside, "type", "veth",
           "peer", "name", node.inside, "netns", ns)
        sh("ip", "-n", self.hub, "link", "set", node.outside, "master", "br0", "up")
        sh("ip", "-n", ns, "addr", "add", f"{node.ip}/24", "dev", node.inside)
        sh("ip", "-n", ns, "link", "set", node.inside, "up")
        self.nodes[name] = node
        return node

    def drop_randomly(self, node: Node, probability: float) -> None:
        """Drop ``probability`` of the packets ``node`` receives from the network."""
        sh("ip", "netns", "exec", node.ns, _iptables(), "-w", "-A", "INPUT", "!", "-i", "lo",
           "-m", "statistic", "--mode", "random", "--probability", str(probability),
           "-j", "DROP")

    def dropped(self, node: Node) -> int:
        """Packets the loss rule of ``node`` has dropped so far."""
        listing = sh("ip", "netns", "exec", node.ns, _iptables(), "-w", "-L", "INPUT",
                     "-v", "-n", "-x")
        return sum(int(line.split()[0]) for line in listing.splitlines()
                   if "DROP" in line and "statistic" in line)

    def cap(self, node: Node, rate: str) -> None:
        """A token bucket on both ends of ``node``'s link: each direction at ``rate``."""
        for ns, dev in ((node.ns, node.inside), (self.hub, node.outside)):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
               "rate", rate, "burst", "32kb", "latency", "200ms")

    def overlimits(self, node: Node) -> int:
        """Times the token buckets of ``node``'s link held a packet back."""
        total = 0
        for ns, dev in ((node.ns, node.inside), (self.hub, node.outside)):
            stats = sh("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev)
            total += sum(int(m) for m in re.findall(r"overlimits (\d+)", stats))
        return total

    def start(self, name: str, node: Node, argv: list[str]) -> ManagedProcess:
        """``argv`` (a Python command line) as a process inside ``node``'s namespace."""
        process = ManagedProcess(name, ["ip", "netns", "exec", node.ns, *argv],
                                 self.log_dir / f"{name}.log", env=CHILD_ENV)
        process.start()
        self.processes.append(process)
        return process

    def teardown(self) -> list[str]:
        """Stop every process, then delete every namespace (its veths, bridge and rules
        with it); the problems met, if any."""
        problems: list[str] = []
        stop_all(self.processes)
        for ns in reversed(self.namespaces):
            # anything still inside a namespace of this run keeps it (and its veth) alive
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                  timeout=IP_TIMEOUT_S).stdout.split()
            for pid in pids:
                problems.append(f"pid {pid} still in {ns}; killed")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            if ns != self.hub and _iptables():
                subprocess.run(["ip", "netns", "exec", ns, _iptables(), "-w", "-F"],
                               capture_output=True, timeout=IP_TIMEOUT_S)
            gone = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True,
                                  timeout=IP_TIMEOUT_S)
            if gone.returncode != 0:
                problems.append(f"ip netns del {ns}: {gone.stderr.strip()}")
        self.namespaces.clear()
        return problems


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A fresh test network (unique names and subnet); everything removed at teardown."""
    tag = f"bz{secrets.token_hex(3)[:5]}"
    rng = secrets.SystemRandom()
    network = Lab(tag, f"10.{rng.randrange(200, 250)}.{rng.randrange(1, 255)}",
                  tmp_path / "logs")
    try:
        network.build_bridge()
        yield network
    finally:
        problems = network.teardown()
        left = [ns for ns in sh("ip", "netns", "list").split() if ns.startswith(tag)]
        assert not left, f"namespaces left behind: {left}"
        assert not problems, problems


def _endpoint(ready: Path, process: ManagedProcess) -> str:
    """What a server, proxy or relay wrote to its ready file (fails if it died first)."""

    def read() -> str:
        if process.returncode is not None:
            pytest.fail(f"{process.name} exited {process.returncode}: {process.tail()}")
        return ready.read_text(encoding="utf-8").strip() if ready.exists() else ""

    return str(wait_for(read, READY_S, f"{process.name} to listen"))


def _hostport(endpoint: str) -> str:
    return endpoint.removeprefix("tcp://")


@pytest.mark.netns
@pytest.mark.scenario
@pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")
def test_a_cluster_across_namespaces_with_latency_loss_and_a_bandwidth_cap_ends_bit_identical(
        lab: Lab, tmp_path: Path) -> None:
    n, num_shards = 6, 2
    cfg = RunConfig(dataset="synthetic", num_workers=n, num_shards=num_shards, rule="marmed",
                    rounds=25, lr=0.1, batch_size=32, seed=5).validate()
    attack = AttackConfig.build(proxy_attack="gambler", proxy_shards=(0,), gambler_p=0.002,
                                corrupt_params=True).validate(cfg)
    out = tmp_path / "run"
    keys = out / "keys"
    sh(sys.executable, "-m", "ps.keys.cli", "--dir", str(keys), "--shards", str(num_shards),
       "--workers", str(n), "--proxies", "0")
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=out,
                       # one server process a shard; no evaluator (none is started
                       # here: the servers neither hold round 0 nor linger for one)
                       cluster=ClusterOptions(server_processes=num_shards, no_evaluator=True),
                       security=SecurityOptions(keys=keys))
    builder = Cluster(spec)  # only its argv builders: the flags each role gets
    out.mkdir(parents=True, exist_ok=True)

    servers = [lab.add_node(f"s{s}") for s in range(num_shards)]
    proxy = lab.add_node("px")
    groups = {"wa": range(0, n // 2), "wb": range(n // 2, n)}
    hosts = {g: lab.add_node(g) for g in groups}
    for node in lab.nodes.values():
        lab.drop_randomly(node, LOSS)
    lab.cap(servers[1], RATE)

    python = [sys.executable, "-m"]
    fronts = []
    for s, node in enumerate(servers):
        ready = out / f"server-{s}.endpoint"
        process = lab.start(f"server-{s}", node, [*python, "server.cli", *builder.server_argv(
            s, ready, bind=f"tcp://{node.ip}:*")])
        fronts.append(_endpoint(ready, process))
    ready = out / "proxy-0.endpoint"
    process = lab.start("proxy-0", proxy, [*python, "ps.proxy.cli", *builder.proxy_argv(
        0, fronts[0], ready, bind=f"tcp://{proxy.ip}:*")])
    fronts[0] = _endpoint(ready, process)

    def relay(name: str, node: Node, front: str, listen: str = "127.0.0.1:0") -> str:
        """A delay relay in ``node``'s namespace to ``front``; the HOST:PORT it got."""
        ready = out / f"{name}.ready"
        process = lab.start(name, node, [
            sys.executable, str(RELAY), "--listen", listen, "--to", _hostport(front),
            "--delay-ms", str(DELAY_MS), "--jitter-ms", str(JITTER_MS),
            "--seed", str(len(lab.processes)), "--ready-file", str(ready)])
        return _endpoint(ready, process)

    relayed = {g: [relay(f"relay-{g}-{s}", node, front) for s, front in enumerate(fronts)]
               for g, node in hosts.items()}
    for g, node in hosts.items():  # one process runs the group's team of workers
        team = tuple(groups[g])
        lab.start(f"worker-{team[0]}", node, [*python, "worker.cli", *builder.worker_argv(
            team, [f"tcp://{where}" for where in relayed[g]])])
    cluster = [p for p in lab.processes if not p.name.startswith("relay-")]

    # mid-run, group A's relay to the proxy dies and comes back on its port: its
    # connections reset, what was in flight on them is lost and must be sent again
    wait_for(lambda: len(read_jsonl(out / "server-0.jsonl")) >= cfg.rounds // 2,
             RUN_DEADLINE_S, "half of the rounds")
    victim = next(p for p in lab.processes if p.name == "relay-wa-0")
    victim.signal(signal.SIGKILL)
    assert victim.wait(10)
    assert relay("relay-wa-0-again", hosts["wa"], fronts[0], relayed["wa"][0]) == relayed["wa"][0]

    def finished() -> bool:
        failed = [p for p in cluster if p.returncode not in (None, 0)]
        if failed:
            pytest.fail("; ".join(f"{p.name} exited {p.returncode}: " + "\n".join(p.tail())
                                  for p in failed))
        return all(p.returncode == 0 for p in cluster)

    wait_for(finished, RUN_DEADLINE_S, f"the run of {cfg.rounds} rounds to finish")

    params = final_parameters(out, cfg, KeyRing(keys))
    torch.set_num_threads(1)  # the processes use one thread; so must the reference
    participation = read_participation(out, num_shards, n, cfg.rounds)
    assert participation.rounds_closed_short == 0
    reference = simulate(cfg, attack, participation=participation)
    assert reference.corrupted_values > 0
    assert params_digest(params) == reference.digest
    np.testing.assert_array_equal(params, reference.params)

    # the network really was degraded
    assert sum(lab.dropped(node) for node in lab.nodes.values()) > 0
    assert lab.overlimits(servers[1]) > 0
    for i in range(n):
        exchanges = [r["exchange_ms"] for r in read_jsonl(out / f"worker-{i}.jsonl")]
        assert len(exchanges) == cfg.rounds
        # each exchange is a push out and its reply back: at least two relay delays (a
        # worker borrowing its team's values still pushes and waits for its own reply)
        assert min(exchanges) >= 2 * (DELAY_MS - JITTER_MS), (i, min(exchanges))
    proxy_rounds = read_jsonl(out / "proxy-0.jsonl")
    assert sum(r.get("corrupted_values", 0) for r in proxy_rounds) > 0


# -- the relay itself, and a worker behind a relay whose server is not up (no root) ------

@pytest.fixture
def relays(tmp_path: Path) -> Iterator[list[ManagedProcess]]:
    """``delay_relay.py`` processes started by a test; stopped at teardown."""
    started: list[ManagedProcess] = []
    yield started
    stop_all(started)


def _relay(relays: list[ManagedProcess], tmp_path: Path, to: str, *flags: str,
           listen: str = "127.0.0.1:0") -> str:
    """A relay on ``listen`` (default a free loopback port) to ``to`` (HOST:PORT); the
    HOST:PORT it got."""
    ready = tmp_path / f"relay-{len(relays)}.ready"
    process = ManagedProcess(f"relay-{len(relays)}", [
        sys.executable, str(RELAY), "--listen", listen, "--to", to,
        "--ready-file", str(ready), *flags], tmp_path / "logs" / f"relay-{len(relays)}.log")
    process.start()
    relays.append(process)
    return _endpoint(ready, process)


def _echo_server() -> tuple[socket.socket, str]:
    """A loopback TCP server echoing every connection until its peer closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(1 << 16):
            conn.sendall(data)


def _connect(hostport: str) -> socket.socket:
    host, port = hostport.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _receive(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        assert chunk, f"connection closed after {len(got)} of {size} bytes"
        got += chunk
    return bytes(got)


def test_delay_relay_delays_both_directions_in_order_and_closes_the_peer(
        relays: list[ManagedProcess], tmp_path: Path) -> None:
    listener, target = _echo_server()
    try:
        where = _relay(relays, tmp_path, target, "--delay-ms", "20", "--jitter-ms", "5",
                       "--seed", "1")
        with _connect(where) as sock:
            for _ in range(5):  # a round trip crosses the relay twice: >= 2 x 15 ms
                began = time.monotonic()
                sock.sendall(b"ping")
                assert _receive(sock, 4) == b"ping"
                assert time.monotonic() - began >= 2 * 0.015
            # many small chunks, each with its own jittered delay, come back in order
            data = os.urandom(2_000_000)
            writer = threading.Thread(target=lambda: [sock.sendall(data[i:i + 1000])
                                                      for i in range(0, len(data), 1000)])
            writer.start()
            assert _receive(sock, len(data)) == data
            writer.join()
            sock.shutdown(socket.SHUT_WR)  # this side ends: the relay closes the other
            assert sock.recv(1) == b""
        relay = relays[-1]
        relay.signal(signal.SIGTERM)
        assert relay.wait(10) and relay.returncode == 0, relay.tail()
    finally:
        listener.close()


HANDSHAKE_CFG = RunConfig(dataset="synthetic", num_workers=1, num_shards=1, rule="mean", q=0,
                          rounds=3, seed=2).validate()


def test_a_worker_waits_for_a_server_that_is_not_up_yet_behind_a_relay(
        processes, relays: list[ManagedProcess], tmp_path: Path, run_keys) -> None:
    """A relay (or load balancer, docker-proxy) accepts the worker's connection and closes
    it while its server is not reachable: the CURVE handshake fails with no detail, as
    with an impostor. The worker must keep trying (it exited 3 at once, 'impostor')."""
    keys = run_keys(1, 1)
    reserved = socket.socket()  # the server's future port: bound, not listening (refused)
    reserved.bind(("127.0.0.1", 0))
    port = reserved.getsockname()[1]
    try:
        where = _relay(relays, tmp_path, f"127.0.0.1:{port}", "--delay-ms", "5")
        worker = processes.start("worker-0", "worker.cli", [
            "--servers", f"tcp://{where}", "--worker-id", "0", "--timeout", "30", *keys,
            *to_argv(HANDSHAKE_CFG, SERVER)])

        def handshake_closed() -> bool:
            if worker.returncode is not None:
                pytest.fail(f"the worker exited {worker.returncode}: {worker.tail()}")
            return any("during the security handshake" in line for line in worker.tail())

        wait_for(handshake_closed, 60, "the worker to meet a closed handshake")
    finally:
        reserved.close()
    server = processes.start("server-0", "server.cli", [
        "--shard", "0", "--bind", f"tcp://127.0.0.1:{port}", "--out-dir", str(tmp_path),
        "--linger", "0",
        *keys, *to_argv(HANDSHAKE_CFG, SERVER)])
    assert processes.wait_exit(worker, 60) == 0, worker.tail()
    assert processes.wait_exit(server, 60) == 0, server.tail()
    assert len(read_jsonl(tmp_path / "server-0.jsonl")) == HANDSHAKE_CFG.rounds


def _status(sock: zmq.Socket) -> StatusReply:
    """Ask a server for its state on ``sock`` (one connection for all the polls: a key
    may start 20 handshakes per 10 s, common/net/admission.py)."""
    sock.send_multipart([b"", *encode(Status())])
    assert sock.poll(10_000), "no STATUS reply"
    return decode(sock.recv_multipart()[1:]).header


DROP_CFG = RunConfig(dataset="synthetic", num_workers=2, num_shards=1, rule="mean", q=0,
                     rounds=4, seed=3).validate()


def test_a_connection_lost_with_a_push_in_flight_is_resent_without_waiting_the_timeout(
        processes, relays: list[ManagedProcess], tmp_path: Path, run_keys) -> None:
    """Worker 0 reaches the server through a relay, which is restarted while its push
    waits for the round's parameters: the reply to the lost connection cannot arrive.
    The worker must reconnect and push again at once (it waited out its 60 s timeout)."""
    keys = run_keys(1, DROP_CFG.num_workers)
    flags = [*keys, *to_argv(DROP_CFG, SERVER)]
    ready = tmp_path / "server-0.endpoint"
    server = processes.start("server-0", "server.cli", [
        "--shard", "0", "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
        "--out-dir", str(tmp_path), "--linger", "0", *flags])
    endpoint = processes.endpoint(ready, server)
    where = _relay(relays, tmp_path, _hostport(endpoint), "--delay-ms", "5")
    first = processes.start("worker-0", "worker.cli", [
        "--servers", f"tcp://{where}", "--worker-id", "0", "--timeout", "60", *flags])

    monitor = connect_dealer(zmq.Context.instance(), endpoint, 0,
                             KeyRing(Path(keys[1])).client_curve("evaluator", 0))

    def parked() -> bool:  # round 0 waits for worker 1; worker 0's push is in
        if first.returncode is not None:
            pytest.fail(f"worker 0 exited {first.returncode}: {first.tail()}")
        return _status(monitor).pushes == [0]

    try:
        wait_for(parked, 60, "worker 0's push of round 0")
    finally:
        monitor.close(linger=0)
    relays[0].signal(signal.SIGKILL)
    assert relays[0].wait(10)
    assert _relay(relays, tmp_path, _hostport(endpoint), "--delay-ms", "5",
                  listen=where) == where  # the same port again
    second = processes.start("worker-1", "worker.cli", [
        "--servers", endpoint, "--worker-id", "1", "--timeout", "60", *flags])
    # well within worker 0's 60 s timeout
    for worker in (first, second, server):
        assert processes.wait_exit(worker, 40) == 0, worker.tail()
    assert any("lost with a request in flight" in line for line in first.tail(40))
    assert len(read_jsonl(tmp_path / "server-0.jsonl")) == DROP_CFG.rounds
