"""CURVE keys through real processes: who may connect, and as whom they may push."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zmq

from common.conf.settings import SERVER, to_argv
from common.errors import EXIT_CONFIG, EXIT_PEER
from common.net.keys import CurveClient, KeyRing, create_keys
from common.net.protocol import Error, ErrorCode, Header, Hello, Push, Welcome, decode, encode
from common.net.transport import CURVE_IO_THREADS, bind_router, connect_dealer
from common.run.config import AttackConfig, RunConfig
from tests.integration.conftest import handshake_refused, watched_dealer

pytestmark = pytest.mark.integration

CFG = RunConfig(dataset="synthetic", num_workers=5, num_shards=1, rule="mean", q=0,
                rounds=3, seed=2).validate()


@pytest.fixture
def keyed_server(processes, tmp_path: Path, run_keys) -> tuple[str, Path]:
    keys = run_keys(CFG.num_shards, CFG.num_workers)
    ready = tmp_path / "server.endpoint"
    proc = processes.start("server-0", "server.cli", [
        "--shard", "0", "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
        "--out-dir", str(tmp_path), "--linger", "0", *keys, *to_argv(CFG, SERVER)])
    return processes.endpoint(ready, proc), Path(keys[1])


def _ask(sock: zmq.Socket, header: Header, tensor: np.ndarray | None = None,
         wait_ms: int = 5000) -> Header | None:
    try:
        sock.send_multipart([b"", *encode(header, tensor)], flags=zmq.NOBLOCK)
    except zmq.Again:  # no connection: the handshake was refused
        return None
    if not sock.poll(wait_ms):
        return None
    frames = sock.recv_multipart()
    return decode(frames[1:]).header


def _hello(worker: int) -> Hello:
    return Hello(role="worker", worker=worker, config_hash=CFG.config_hash,
                 config=CFG.to_dict())


def test_a_worker_key_cannot_say_hello_or_push_as_another_worker(keyed_server) -> None:
    endpoint, keys = keyed_server
    sock = connect_dealer(zmq.Context.instance(), endpoint, 0,
                          KeyRing(keys).client_curve("worker-3", 0))
    try:
        reply = _ask(sock, _hello(4))
        assert isinstance(reply, Error) and reply.code == ErrorCode.FORBIDDEN.value
        assert "worker-3" in reply.message
        welcome = _ask(sock, _hello(3))
        assert isinstance(welcome, Welcome)
        values = np.zeros(welcome.length, dtype=np.float32)
        reply = _ask(sock, Push(round=0, worker=4, length=values.size), values)
        assert isinstance(reply, Error) and reply.code == ErrorCode.FORBIDDEN.value
        reply = _ask(sock, Push(round=0, worker=3, length=values.size), values)
        assert not isinstance(reply, Error)
    finally:
        sock.close(linger=0)


def test_a_keyed_server_runs_its_cipher_on_two_io_threads(processes, keyed_server) -> None:
    """A round's close encrypts PARAMS for every worker process: with keys, the server's
    connections are shared by two ZeroMQ I/O threads (``CURVE_IO_THREADS``), not one."""
    pid = processes.started[0].pid
    names = [(task / "comm").read_text().strip()
             for task in Path(f"/proc/{pid}/task").iterdir()]
    assert sum(name.startswith("ZMQbg/IO/") for name in names) == CURVE_IO_THREADS == 2, names


def test_a_client_without_an_admitted_key_gets_nothing(keyed_server) -> None:
    """No CURVE, or a key the server does not admit: the handshake ends without success
    (seen on the socket's monitor), and a HELLO gets no reply."""
    endpoint, keys = keyed_server
    ctx = zmq.Context.instance()
    stranger_public, stranger_secret = zmq.curve_keypair()
    for curve in (None, CurveClient(stranger_public, stranger_secret,
                                    KeyRing(keys).public("server-0"))):
        sock = watched_dealer(ctx, endpoint, curve)
        try:
            assert handshake_refused(sock)
            assert _ask(sock, _hello(0), wait_ms=500) is None
        finally:
            sock.close(linger=0)


def test_a_worker_facing_an_impostor_exits_3_naming_the_endpoint(processes, tmp_path) -> None:
    genuine, impostor = tmp_path / "genuine", tmp_path / "impostor"
    create_keys(genuine, 1, CFG.num_workers)
    create_keys(impostor, 1, CFG.num_workers)
    ctx = zmq.Context.instance()
    # a server that holds another run's key (a man in the middle without the real one)
    curve = KeyRing(impostor).server_curve(0, CFG.num_workers)
    sock, endpoint = bind_router(ctx, "tcp://127.0.0.1:*", curve)
    try:
        # the request gives up with the handshake never through: the same error as at
        # the end of the grace (HANDSHAKE_GRACE_S, unit-tested in test_worker_core.py)
        worker = processes.start("worker-0", "worker.cli", [
            "--servers", endpoint, "--worker-id", "0", "--timeout", "3", "--retries", "0",
            "--keys", str(genuine), *to_argv(CFG, SERVER)])
        assert processes.wait_exit(worker, 60) == EXIT_PEER
        assert any("handshake" in line and endpoint in line for line in worker.tail())
    finally:
        sock.close(linger=0)


def test_roles_refuse_to_start_without_keys_unless_insecure(processes, tmp_path) -> None:
    server = processes.start("server-0", "server.cli", [
        "--shard", "0", "--bind", "tcp://127.0.0.1:*", *to_argv(CFG, SERVER)])
    assert processes.wait_exit(server, 60) == EXIT_CONFIG
    assert any("--insecure" in line for line in server.tail())


def test_shards_of_several_chunks_cross_curve(tmp_path: Path) -> None:
    """A shard above one wire chunk (4 MB) with keys: each chunk arrives as a CURVE
    MESSAGE 33 bytes longer than itself, which the inbound frame limit must allow (it
    once disconnected every such push and pull, so the run never started). The 10.6M
    parameter model over 2 shards: 21 MB, 6 chunks a message."""
    import torch

    from ps.launcher.cluster import Cluster, ClusterSpec
    from ps.launcher.options import ClusterOptions
    from ps.reference.engine import simulate
    from worker.options import ClientOptions

    cfg = RunConfig(dataset="synthetic", model="wide", num_workers=3, num_shards=2,
                    rule="mean", q=0, rounds=2, seed=1).validate()
    attack = AttackConfig().validate(cfg)
    spec = ClusterSpec(cfg=cfg, attack=attack, out_dir=tmp_path / "run",
                       client=ClientOptions(timeout_s=20, retries=1),
                       cluster=ClusterOptions(run_timeout_s=120, no_evaluator=True))
    result = Cluster(spec).run()
    torch.set_num_threads(1)
    assert result.digest == simulate(cfg, attack).digest
