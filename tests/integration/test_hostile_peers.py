"""A real server keeps serving honest workers while a raw ZeroMQ peer sends garbage;
misconfigured and stranded workers exit with the documented codes."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from common.conf.settings import SERVER, to_argv
from common.errors import EXIT_CONFIG, EXIT_TIMEOUT
from common.net.protocol import (
    PROTOCOL_VERSION,
    Error,
    ErrorCode,
    Hello,
    Op,
    Pull,
    Push,
    Status,
    StatusReply,
    Welcome,
    encode,
)
from common.run.config import RunConfig
from common.run.metrics import read_jsonl
from tests.integration.conftest import RawPeer, wait_for

pytestmark = pytest.mark.integration

CFG = RunConfig(dataset="synthetic", num_workers=2, num_shards=1, rule="marmed",
                rounds=8, seed=1).validate()


@pytest.fixture
def server(processes, tmp_path: Path) -> str:
    ready = tmp_path / "server.endpoint"
    proc = processes.start("server-0", "server.cli", [
        "--shard", "0", "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
        "--out-dir", str(tmp_path), "--linger", "0", "--insecure", *to_argv(CFG, SERVER),
    ])
    return processes.endpoint(ready, proc)


def _push(round_: int, worker: int, values: np.ndarray) -> list[bytes]:
    header = Push(round=round_, worker=worker, length=values.size)
    return [b"", *[bytes(f) for f in encode(header, values)]]


def test_hostile_frames_get_errors_and_honest_workers_finish(processes, server, tmp_path) -> None:
    peer = RawPeer(server)
    good_len = CFG.num_workers  # placeholder until the WELCOME says the shard's size
    reply = peer.ask(_push(0, 1, np.zeros(good_len, dtype=np.float32)))
    assert isinstance(reply, Error) and reply.code == ErrorCode.HELLO_FIRST.value
    welcome = peer.ask([b"", *encode(Hello(role="worker", worker=1,
                                           config_hash=CFG.config_hash))])
    assert isinstance(welcome, Welcome)
    size = welcome.length
    good = np.zeros(size, dtype=np.float32)
    hostile = {
        ErrorCode.MALFORMED: [
            [b"", b"\xc1garbage"],
            [b"", msgpack.packb({"v": PROTOCOL_VERSION + 9, "op": int(Op.STATUS)})],
            [b"", msgpack.packb({"v": PROTOCOL_VERSION, "op": 77})],
            [b"", msgpack.packb({"v": PROTOCOL_VERSION, "op": int(Op.PUSH), "round": 0,
                                 "worker": 0, "length": size}), b"\x00" * 8],
            [b"no delimiter"],
        ],
        ErrorCode.WRONG_LENGTH: [_push(0, 1, np.zeros(size - 1, dtype=np.float32))],
        ErrorCode.FORBIDDEN: [_push(0, 7, good), _push(0, 0, good)],  # said HELLO as 1
        ErrorCode.WRONG_ROUND: [_push(5, 1, good)],
        ErrorCode.CONFIG_MISMATCH: [
            [b"", *encode(Hello(role="worker", worker=0, config_hash="0" * 16,
                                config={**CFG.to_dict(), "lr": 9.0}))]
        ],
    }
    for code, messages in hostile.items():
        for frames in messages:
            reply = peer.ask(frames)
            assert isinstance(reply, Error) and reply.code == code.value, (frames[:2], reply)
    # Without keys anyone may say HELLO as worker 1 (that is what --insecure means) and
    # push for it; a repeated push is answered as the first was, its values ignored.
    assert not isinstance(peer.ask(_push(0, 1, np.full(size, 1e20, np.float32))), Error)
    assert not isinstance(peer.ask(_push(0, 1, good)), Error)
    reply = peer.ask([b"", *encode(Pull(round=99, worker=1))])
    assert isinstance(reply, Error) and reply.code == ErrorCode.WRONG_ROUND.value

    status = peer.ask([b"", *encode(Status())])
    assert isinstance(status, StatusReply) and status.round == 0 and status.pushes == [1]
    assert status.counters["malformed"] == 5 and status.counters["repeated-push"] == 1
    assert status.counters["hello-first"] == 1 and status.counters["forbidden"] == 2

    # Honest worker 0 joins; round 0 completes with the raw peer's push as worker 1,
    # after which the raw peer cannot push for worker 1 any more: the honest run goes
    # on only if someone pushes for worker 1, so start honest worker 1 from round 1.
    worker = processes.start("worker-0", "worker.cli", [
        "--servers", server, "--worker-id", "0", "--timeout", "20", "--insecure",
        *to_argv(CFG, SERVER)])
    def round_one() -> bool:
        s = peer.ask([b"", *encode(Status())])
        return s.round >= 1

    wait_for(round_one, 60, "round 0 to complete")
    other = processes.start("worker-1", "worker.cli", [
        "--servers", server, "--worker-id", "1", "--timeout", "20", "--insecure",
        *to_argv(CFG, SERVER)])
    assert processes.wait_exit(worker, 120) == 0
    assert processes.wait_exit(other, 120) == 0
    peer.close()
    rounds = read_jsonl(tmp_path / "server-0.jsonl")
    assert [r["round"] for r in rounds] == list(range(CFG.rounds))
    assert all(r["params_finite"] for r in rounds)  # MarMed absorbed the 1e20 push
    assert rounds[-1]["errors"] >= 10


def test_misconfigured_worker_is_refused_naming_the_setting(processes, server) -> None:
    args = to_argv(CFG, SERVER)
    args[args.index("--lr") + 1] = "0.5"
    worker = processes.start("worker-0", "worker.cli", [
        "--servers", server, "--worker-id", "0", "--timeout", "20", "--insecure", *args])
    assert processes.wait_exit(worker, 60) == EXIT_CONFIG
    assert any("lr: 0.1 != 0.5" in line for line in worker.tail())


def test_unreachable_cluster_times_out_with_exit_code_4(processes) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)  # bound but silent: requests vanish
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        worker = processes.start("worker-0", "worker.cli", [
            "--servers", f"tcp://127.0.0.1:{port}", "--worker-id", "0", "--timeout", "0.5",
            "--retries", "1", "--insecure", *to_argv(CFG, SERVER)])
        assert processes.wait_exit(worker, 60) == EXIT_TIMEOUT
        assert any("no reply" in line for line in worker.tail())
    finally:
        sock.close(linger=0)
