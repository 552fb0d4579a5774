"""CURVE keys through real processes: who may connect, and as whom they may push."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zmq

from common.config import RunConfig
from common.errors import EXIT_CONFIG, EXIT_PEER
from common.keys import CurveClient, KeyRing, create_keys
from common.protocol import Error, ErrorCode, Header, Hello, Push, Welcome, decode, encode
from common.settings import SERVER, to_argv
from common.transport import bind_router, connect_dealer

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


def _ask(sock: zmq.Socket, header: Header, tensor: np.ndarray | None = None) -> Header | None:
    try:
        sock.send_multipart([b"", *encode(header, tensor)], flags=zmq.NOBLOCK)
    except zmq.Again:  # no connection: the handshake was refused
        return None
    if not sock.poll(5000):
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
        values = np.zeros(welcome.stop - welcome.start, dtype=np.float32)
        reply = _ask(sock, Push(round=0, worker=4, length=values.size), values)
        assert isinstance(reply, Error) and reply.code == ErrorCode.FORBIDDEN.value
        reply = _ask(sock, Push(round=0, worker=3, length=values.size), values)
        assert not isinstance(reply, Error)
    finally:
        sock.close(linger=0)


def test_a_client_without_an_admitted_key_gets_nothing(keyed_server) -> None:
    endpoint, keys = keyed_server
    ctx = zmq.Context.instance()
    plain = connect_dealer(ctx, endpoint, 0)
    stranger_public, stranger_secret = zmq.curve_keypair()
    stranger = connect_dealer(ctx, endpoint, 0, CurveClient(
        stranger_public, stranger_secret, KeyRing(keys).public("server-0")))
    try:
        assert _ask(plain, _hello(0)) is None
        assert _ask(stranger, _hello(0)) is None
    finally:
        plain.close(linger=0)
        stranger.close(linger=0)


def test_a_worker_facing_an_impostor_exits_3_naming_the_endpoint(processes, tmp_path) -> None:
    genuine, impostor = tmp_path / "genuine", tmp_path / "impostor"
    create_keys(genuine, 1, CFG.num_workers)
    create_keys(impostor, 1, CFG.num_workers)
    ctx = zmq.Context.instance()
    # a server that holds another run's key (a man in the middle without the real one)
    sock, endpoint = bind_router(ctx, "tcp://127.0.0.1:*", KeyRing(impostor).server_curve(0))
    try:
        worker = processes.start("worker-0", "worker.cli", [
            "--servers", endpoint, "--worker-id", "0", "--timeout", "30", "--keys",
            str(genuine), *to_argv(CFG, SERVER)])
        assert processes.wait_exit(worker, 60) == EXIT_PEER
        assert any("handshake" in line and endpoint in line for line in worker.tail())
    finally:
        sock.close(linger=0)


def test_roles_refuse_to_start_without_keys_unless_insecure(processes, tmp_path) -> None:
    server = processes.start("server-0", "server.cli", [
        "--shard", "0", "--bind", "tcp://127.0.0.1:*", *to_argv(CFG, SERVER)])
    assert processes.wait_exit(server, 60) == EXIT_CONFIG
    assert any("--insecure" in line for line in server.tail())
