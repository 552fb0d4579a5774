"""The evaluator facing a hostile server (or a proxy answering for one): a real
``run_evaluator`` and its sockets against a scripted ROUTER on loopback."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zmq

from common.errors import ConfigError, PeerError
from common.learn.models import count_parameters
from common.net.protocol import (
    Error,
    Header,
    Hello,
    Params,
    Pull,
    Welcome,
    decode,
    encode,
    join_envelope,
    split_envelope,
)
from common.run.config import RunConfig
from common.run.metrics import read_jsonl
from worker.evaluator import run_evaluator
from worker.options import ClientOptions, EvalOptions

CFG = RunConfig(dataset="synthetic", num_workers=1, num_shards=1, rule="mean", q=0,
                rounds=6).validate()
D = count_parameters(CFG.model, (1, 28, 28), 10)


@contextmanager
def hostile_server(answer: Callable[[Header], list | None]) -> Iterator[str]:
    """A ROUTER on loopback answering each request with ``answer(header)``'s frames."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if sock.poll(50):
                envelope, frames = split_envelope(sock.recv_multipart())
                out = answer(decode(frames).header)
                if out is not None:
                    sock.send_multipart(join_envelope(envelope, out))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(5)
        sock.close(0)


def welcome(d: int = D) -> list:
    return encode(Welcome(shards=[0], num_shards=1, d=d, length=d, round=0, rounds=6))


def evaluate(endpoint: str, out: Path) -> None:
    run_evaluator(CFG, ClientOptions(servers=endpoint, evaluate=True, timeout_s=5, retries=1),
                  EvalOptions(eval_every=2), out)


def test_a_server_sending_the_evaluator_back_in_rounds_ends_it(tmp_path: Path) -> None:
    """``stale-round`` at a round at or before the one asked for: no honest server says
    so. Before, the evaluator went back there and evaluated round 0 again, for ever
    (two immediate ERRORs a cycle, so no timeout fired, and a line a cycle)."""
    def answer(header: Header) -> list | None:
        if isinstance(header, Hello):
            return welcome()
        if isinstance(header, Pull) and header.round >= 2:
            return encode(Error(code="stale-round", message="x", round=0))
        if isinstance(header, Pull):
            return encode(Params(round=header.round, shards=[0], length=D),
                          np.zeros(D, np.float32))
        return None

    with hostile_server(answer) as endpoint, pytest.raises(
            PeerError, match=r"says round 2 is stale at round 0, not one of 3\.\.6"):
        evaluate(endpoint, tmp_path)
    assert [r["round"] for r in read_jsonl(tmp_path / "evaluator.jsonl")] == [0]


def test_a_welcome_of_another_model_size_is_a_configuration_error(tmp_path: Path) -> None:
    """Before, a smaller d whose length matched was taken, and loading its PARAMS into
    the model raised: a traceback, exit 1."""
    def answer(header: Header) -> list | None:
        return welcome(10) if isinstance(header, Hello) else None

    with hostile_server(answer) as endpoint, pytest.raises(
            ConfigError, match=f"servers hold d=10 parameters, this evaluator's model has {D}"):
        evaluate(endpoint, tmp_path)
