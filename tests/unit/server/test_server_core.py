"""The server node's core without sockets: messages in, replies out, a fake clock.

``ServerCore.handle(incoming, now)`` is driven with messages encoded and decoded by
the real protocol code and wrapped as the transport would wrap them; ``now`` is a
plain float, so lingering is tested without sleeping.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import server.core
from common.errors import ConfigError
from common.learn.rules.defence import Defence
from common.learn.rules.pre import RoundContext
from common.net.keys import Identity
from common.net.protocol import (
    Ack,
    Error,
    ErrorCode,
    Header,
    Hello,
    Params,
    ProtocolError,
    Pull,
    Push,
    Status,
    StatusReply,
    Welcome,
    decode,
    encode,
)
from common.net.transport import Incoming
from common.run.config import RunConfig
from common.run.metrics import JsonlWriter, read_jsonl
from server.checkpoint import Checkpoint
from server.core import CHECKPOINT_FAILED, REPEATED_PUSH, Reply, ServerCore
from server.options import ServerOptions
from server.sessions import MAX_SESSIONS_PER_PRINCIPAL

CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rule="mean", q=0, lr=0.5,
                rounds=4).validate()
INITIAL = np.arange(10, dtype=np.float32)
SHARD = INITIAL[0:5]  # shard 0 of 2 holds [0, 5)
LINGER_S = 5.0
EVALUATOR = b"evaluator"

# -- helpers -------------------------------------------------------------------------


def _env(peer: bytes) -> list[bytes]:
    return [peer]


def _worker_peer(worker: int) -> bytes:
    return f"worker-{worker}".encode()


def message(header: Header, tensor: np.ndarray | None = None, peer: bytes = b"peer-id",
            identity: Identity | None = None) -> Incoming:
    """What the transport hands the core for ``header`` sent by ``peer`` (with the
    CURVE key ``identity``; None: no keys in use)."""
    frames = encode(header, tensor)
    return Incoming(envelope=_env(peer), message=decode(frames), error=None,
                    frames=[peer, b"", *frames], size=sum(len(f) for f in frames),
                    identity=identity)


def garbage(envelope: list[bytes]) -> Incoming:
    """A message the transport could not decode."""
    frames = [b"\xc1not msgpack"]
    return Incoming(envelope=envelope, message=None, error=ProtocolError("garbage"),
                    frames=[*envelope, b"", *frames], size=sum(len(f) for f in frames))


def make_core(tmp_path: Path | None = None, saved: list[list[Checkpoint]] | None = None,
              cfg: RunConfig = CFG, **options: object) -> ServerCore:
    opts = ServerOptions(**{"shard": 0, "linger_s": LINGER_S, "checkpoint_every": 2,
                            **options})  # type: ignore[arg-type]
    metrics = {0: JsonlWriter(tmp_path / "m.jsonl")} if tmp_path is not None else None
    return ServerCore(cfg, opts, INITIAL, metrics=metrics,
                      save=saved.append if saved is not None else None)


def grad(worker: int, round_: int = 0) -> np.ndarray:
    """A distinct gradient shard per worker and round."""
    return np.arange(5, dtype=np.float32) * (worker + 1) + round_


def push(core: ServerCore, worker: int, round_: int | None = None,
         values: np.ndarray | None = None, pull_next: bool = False,
         now: float = 0.0, session: bool = True, bare_params: bool = False) -> list[Reply]:
    """Worker ``worker`` pushes its shard for ``round_`` (default: the current round),
    after its HELLO unless ``session`` is False."""
    round_ = core.state.round if round_ is None else round_
    values = grad(worker, round_) if values is None else values
    header = Push(round=round_, worker=worker, length=values.size, pull_next=pull_next,
                  bare_params=bare_params)
    if session:
        greet(core, _worker_peer(worker), "worker", worker)
    return core.handle(message(header, values, _worker_peer(worker)), now)


def greet(core: ServerCore, peer: bytes, role: str, worker: int) -> None:
    """Open ``peer``'s session (its HELLO) unless it has one."""
    if (peer,) not in core.sessions:
        assert isinstance(only(hello(core, role=role, worker=worker, peer=peer)).header,
                          Welcome)


def run_rounds(core: ServerCore, count: int, now: float = 0.0) -> None:
    """Every worker pushes (without pull_next) for ``count`` rounds."""
    for _ in range(count):
        for w in range(CFG.num_workers):
            push(core, w, now=now)


def run_rounds_replies(core: ServerCore) -> list[Reply]:
    """One round of pushes (without pull_next); every reply they got."""
    return [r for w in range(CFG.num_workers) for r in push(core, w)]


def pull(core: ServerCore, round_: int, peer: bytes = b"reader", worker: int = -1,
         now: float = 0.0) -> list[Reply]:
    greet(core, peer, "worker" if worker >= 0 else "evaluator", worker)
    return core.handle(message(Pull(round=round_, worker=worker), peer=peer), now)


def hello(core: ServerCore, role: str = "worker", worker: int = 0, peer: bytes = b"peer-id",
          cfg: RunConfig | None = None, config_hash: str | None = None,
          config: dict | None = None) -> list[Reply]:
    """A HELLO sending ``cfg`` (default: the core's own; or the given hash and settings)."""
    cfg = core.cfg if cfg is None else cfg
    header = Hello(role=role, worker=worker,
                   config_hash=cfg.config_hash if config_hash is None else config_hash,
                   config=cfg.to_dict() if config is None else config)
    return core.handle(message(header, peer=peer), 0.0)


def only(replies: list[Reply]) -> Reply:
    assert len(replies) == 1, replies
    return replies[0]


def assert_error(replies: list[Reply], code: ErrorCode, round_: int,
                 peer: bytes = b"peer-id") -> Error:
    reply = only(replies)
    assert reply.envelope == _env(peer)
    assert isinstance(reply.header, Error), reply.header
    assert reply.header.code == code.value
    assert reply.header.round == round_
    assert reply.tensor is None
    return reply.header


def assert_params(reply: Reply, round_: int, values: np.ndarray, peer: bytes) -> None:
    assert reply.envelope == _env(peer)
    assert reply.header == Params(round=round_, shards=[0], length=5)
    assert reply.tensor is not None
    np.testing.assert_allclose(np.concatenate(reply.tensor), values, rtol=1e-6)


def expected_after(params: np.ndarray, grads: list[np.ndarray]) -> np.ndarray:
    """params - lr * mean(grads): one step of the mean rule."""
    return params - np.float32(CFG.lr) * np.mean(grads, axis=0, dtype=np.float32)


# -- HELLO ---------------------------------------------------------------------------


def test_hello_is_welcomed_with_the_shard_range_and_round() -> None:
    reply = only(hello(make_core()))
    assert reply.envelope == [b"peer-id"]
    assert reply.header == Welcome(shards=[0], num_shards=2, d=10, length=5, round=0,
                                   rounds=4)
    assert reply.tensor is None


def test_hello_of_the_second_shard_names_its_shards_and_length() -> None:
    core = ServerCore(CFG, ServerOptions(shard="1"), INITIAL)
    welcome = only(hello(core)).header
    assert isinstance(welcome, Welcome)
    assert (welcome.shards, welcome.length, welcome.d) == ([1], 5, 10)


def test_hello_welcome_reports_the_current_round() -> None:
    core = make_core()
    run_rounds(core, 1)
    welcome = only(hello(core, role="evaluator", worker=-1)).header
    assert isinstance(welcome, Welcome) and welcome.round == 1


def test_hello_with_another_config_is_refused_naming_the_setting() -> None:
    core = make_core()
    other = replace(CFG, lr=0.1)
    error = assert_error(hello(core, cfg=other), ErrorCode.CONFIG_MISMATCH, 0)
    assert "lr: 0.5 != 0.1" in error.message
    assert "seed" not in error.message  # only the settings that differ
    assert core.counters[ErrorCode.CONFIG_MISMATCH.value] == 1


def test_hello_with_another_hash_and_no_config_is_refused() -> None:
    core = make_core()
    error = assert_error(hello(core, config_hash="0" * 16, config={}),
                         ErrorCode.CONFIG_MISMATCH, 0)
    assert "no settings sent" in error.message


def test_hello_with_settings_nested_a_thousand_deep_is_a_config_mismatch() -> None:
    """msgpack decodes a list nested 1,000 deep (a HELLO of about 1 KB): naming the
    setting that differs shows it cut short (its repr raised RecursionError, answered
    ``internal``, the path kept for the node's own bugs)."""
    core = make_core()
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    error = assert_error(hello(core, config_hash="0" * 16, config={"lr": deep}),
                         ErrorCode.CONFIG_MISMATCH, 0)
    assert "lr: 0.5 != [[[[...]]]]" in error.message
    assert core.counters[ErrorCode.INTERNAL.value] == 0


def test_a_peers_text_cannot_make_a_log_line_of_its_own(
        caplog: pytest.LogCaptureFixture) -> None:
    """A HELLO's hash with a line break and terminal escapes: the refusal's log line
    shows them escaped, not as a made-up line of its own."""
    core = make_core()
    forged = "0\nWARNING barred worker-1 for good\x1b[2J"
    with caplog.at_level(logging.WARNING, logger="ps.server"):
        assert_error(hello(core, config_hash=forged, config={}), ErrorCode.CONFIG_MISMATCH, 0)
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "0\\nWARNING barred worker-1 for good\\x1b[2J" in line
    assert "\n" not in line and "\x1b" not in line


def test_hello_with_unknown_role_is_malformed() -> None:
    core = make_core()
    assert_error(hello(core, role="gardener"), ErrorCode.MALFORMED, 0)
    assert core.counters[ErrorCode.MALFORMED.value] == 1


@pytest.mark.parametrize("worker", [3, -1, 10**9])
def test_hello_from_a_worker_out_of_range_is_unknown_worker(worker: int) -> None:
    core = make_core()
    error = assert_error(hello(core, worker=worker), ErrorCode.UNKNOWN_WORKER, 0)
    assert str(worker) in error.message
    assert core.counters[ErrorCode.UNKNOWN_WORKER.value] == 1


def test_hello_config_with_a_bytes_key_is_refused_while_decoding() -> None:
    """A header holds no bytes: msgpack refuses one (here a settings name) as it
    decodes, and the node answers what it could not decode as malformed."""
    config = {**CFG.to_dict(), b"lr": 1.0}
    frames = encode(Hello(role="worker", worker=0, config_hash="0" * 16, config=config))
    with pytest.raises(ProtocolError, match="max_bin_len"):
        decode(frames)


# -- PUSH ----------------------------------------------------------------------------


def test_push_without_pull_next_is_acked() -> None:
    core = make_core()
    reply = only(push(core, 1))
    assert reply.envelope == [_worker_peer(1)]
    assert reply.header == Ack(round=0, worker=1)
    assert reply.tensor is None
    assert core.status().pushes == [1]


def test_pull_next_pushes_get_the_next_round_params_when_the_round_completes() -> None:
    core = make_core()
    assert push(core, 0, pull_next=True) == []
    assert push(core, 1, pull_next=True) == []
    replies = push(core, 2, pull_next=True)
    assert sorted(r.envelope[0] for r in replies) == [_worker_peer(w) for w in range(3)]
    expected = expected_after(SHARD, [grad(w) for w in range(3)])
    for reply in replies:
        assert_params(reply, 1, expected, reply.envelope[0])
    assert core.state.round == 1 and core.parked == {}


def test_the_params_of_a_closing_round_share_one_header_and_tensor() -> None:
    core = make_core()
    assert pull(core, 1, peer=b"early") == []  # an evaluator parked for round 1 too
    push(core, 0, pull_next=True)
    push(core, 1, pull_next=True)
    replies = push(core, 2, pull_next=True)
    assert len(replies) == 4
    first = replies[0]
    assert all(r.header is first.header and r.tensor is first.tensor for r in replies)
    assert len({id(r.envelope) for r in replies}) == 4


def test_last_push_without_pull_next_is_acked_and_releases_the_parked() -> None:
    core = make_core()
    push(core, 0, pull_next=True)
    push(core, 1)
    replies = push(core, 2)
    assert replies[0].envelope == [_worker_peer(2)]
    assert replies[0].header == Ack(round=0, worker=2)
    expected = expected_after(SHARD, [grad(w) for w in range(3)])
    assert_params(only(replies[1:]), 1, expected, _worker_peer(0))


def test_rounds_chain_the_mean_update() -> None:
    core = make_core()
    params = SHARD.copy()
    for t in range(CFG.rounds):
        run_rounds(core, 1)
        params = expected_after(params, [grad(w, t) for w in range(3)])
        np.testing.assert_allclose(core.state.states[0].params, params, rtol=1e-6)
    assert core.state.finished


LONG = replace(CFG, rounds=8).validate()  # long enough for rounds to leave the history


@pytest.mark.parametrize(
    ("rounds_done", "round_", "length", "code"),
    [
        (1, 2, 5, ErrorCode.WRONG_ROUND),
        (1, 1, 4, ErrorCode.WRONG_LENGTH),
        (1, 1, 6, ErrorCode.WRONG_LENGTH),
        (4, 4, 5, ErrorCode.FINISHED),
    ],
)
def test_bad_push_gets_an_error_with_the_current_round(
    rounds_done: int, round_: int, length: int, code: ErrorCode
) -> None:
    core = make_core()
    run_rounds(core, rounds_done)
    replies = push(core, 0, round_, np.ones(length, dtype=np.float32))
    assert_error(replies, code, rounds_done, _worker_peer(0))
    assert core.counters == {code.value: 1}
    assert core.status().pushes == []  # nothing stored


@pytest.mark.parametrize("worker", [0, 3, -1])
def test_push_without_a_hello_is_refused_hello_first(worker: int) -> None:
    core = make_core()
    replies = push(core, worker, pull_next=True, session=False)
    assert_error(replies, ErrorCode.HELLO_FIRST, 0, _worker_peer(worker))
    assert core.counters == {ErrorCode.HELLO_FIRST.value: 1}
    assert core.status().pushes == [] and core.parked == {}


@pytest.mark.parametrize("worker", [1, 3, -1])
def test_push_as_another_worker_than_the_hello_is_forbidden(worker: int) -> None:
    core = make_core()
    greet(core, _worker_peer(worker), "worker", 0)  # this peer is worker 0
    replies = push(core, worker, pull_next=True, session=False)
    error = assert_error(replies, ErrorCode.FORBIDDEN, 0, _worker_peer(worker))
    assert f"worker {worker}" in error.message
    assert core.counters == {ErrorCode.FORBIDDEN.value: 1}
    assert core.status().pushes == [] and core.parked == {}


def test_push_from_an_evaluator_session_is_forbidden() -> None:
    core = make_core()
    greet(core, _worker_peer(0), "evaluator", -1)
    assert_error(push(core, 0, session=False), ErrorCode.FORBIDDEN, 0, _worker_peer(0))
    assert core.status().pushes == []


def test_repeated_push_is_acked_again_and_keeps_the_first_values() -> None:
    core = make_core()
    push(core, 1, values=np.full(5, 7.0, dtype=np.float32))
    reply = only(push(core, 1, values=np.full(5, -1.0, dtype=np.float32)))
    assert reply.header == Ack(round=0, worker=1)
    assert core.counters == {REPEATED_PUSH: 1}
    assert core.status().pushes == [1]
    np.testing.assert_array_equal(core.state.states[0].grads[1], np.full(5, 7.0))


def test_repeated_pull_next_push_stays_parked_once_and_gets_one_reply() -> None:
    core = make_core()
    assert push(core, 0, pull_next=True) == []
    assert push(core, 0, pull_next=True) == []
    assert len(core.parked) == 1
    push(core, 1)
    replies = push(core, 2)
    expected = expected_after(SHARD, [grad(w) for w in range(3)])
    assert_params(only(replies[1:]), 1, expected, _worker_peer(0))
    assert core.counters == {REPEATED_PUSH: 1}


def test_repeated_push_of_a_kept_past_round_is_answered_from_history() -> None:
    core = make_core()
    run_rounds(core, 1)
    after_0 = core.state.states[0].params.copy()
    run_rounds(core, 1)
    assert only(push(core, 0, round_=0)).header == Ack(round=0, worker=0)
    # a restarted worker (another peer) asks for the round after its push again
    greet(core, b"worker-0-restarted", "worker", 0)
    header = Push(round=0, worker=0, length=5, pull_next=True)
    replies = core.handle(message(header, np.ones(5, dtype=np.float32),
                                  b"worker-0-restarted"), 0.0)
    assert_params(only(replies), 1, after_0, b"worker-0-restarted")
    assert core.counters == {REPEATED_PUSH: 2}
    assert core.state.round == 2 and core.status().pushes == []  # nothing stored


def test_repeated_push_of_the_last_round_after_the_run_finished_gets_the_final_params(
) -> None:
    core = make_core()
    run_rounds(core, 4)
    assert_params(only(push(core, 1, round_=3, pull_next=True)), 4, core.state.states[0].params,
                  _worker_peer(1))
    assert core.counters == {REPEATED_PUSH: 1}


def test_push_of_a_round_no_longer_kept_is_stale() -> None:
    core = make_core(cfg=LONG)
    for _ in range(6):  # keeps rounds 3..6
        for w in range(3):
            push(core, w)
    assert only(push(core, 0, round_=2)).header == Ack(round=2, worker=0)  # 3 is kept
    assert_error(push(core, 0, round_=1), ErrorCode.STALE_ROUND, 6, _worker_peer(0))
    assert core.counters == {REPEATED_PUSH: 1, ErrorCode.STALE_ROUND.value: 1}


def test_refused_push_with_pull_next_is_not_parked() -> None:
    core = make_core()
    assert_error(push(core, 0, round_=1, pull_next=True), ErrorCode.WRONG_ROUND, 0,
                 _worker_peer(0))
    assert core.parked == {}


def test_push_refused_because_the_park_is_full_is_not_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server.core, "MAX_PARKED", 2)
    core = make_core()
    push(core, 0, pull_next=True)
    push(core, 1, pull_next=True)
    assert_error(push(core, 2, pull_next=True), ErrorCode.BUSY, 0, _worker_peer(2))
    assert core.counters == {ErrorCode.BUSY.value: 1}
    # refused, so worker 2 may push again (here without asking for the next round)
    assert core.status().pushes == [0, 1]
    replies = push(core, 2)
    assert replies[0].header == Ack(round=0, worker=2)
    assert sorted(r.envelope[0] for r in replies[1:]) == [_worker_peer(0), _worker_peer(1)]
    assert core.state.round == 1 and core.parked == {}


def test_pull_next_push_of_a_peer_already_waiting_for_two_rounds_is_busy() -> None:
    core = make_core()
    peer = _worker_peer(0)
    assert pull(core, 2, peer=peer, worker=0) == []
    assert pull(core, 3, peer=peer, worker=0) == []
    assert_error(push(core, 0, pull_next=True), ErrorCode.BUSY, 0, peer)
    assert core.status().pushes == []  # not stored


# -- bare PARAMS ---------------------------------------------------------------------

BARE = Params(round=1, shards=[0], length=5, bare=True)


def _parked_key(worker: int, round_: int) -> tuple[tuple[bytes, ...], int]:
    return ((_worker_peer(worker),), round_)


def test_a_bare_params_push_parks_marked_bare() -> None:
    core = make_core()
    assert push(core, 1, pull_next=True, bare_params=True) == []
    assert push(core, 2, pull_next=True) == []
    assert set(core.parked) == {_parked_key(1, 1), _parked_key(2, 1)}
    assert core.bare == {_parked_key(1, 1)}


def test_at_round_close_bare_pushes_share_one_bare_header_and_the_others_get_the_values(
) -> None:
    core = make_core()
    assert push(core, 0, pull_next=True) == []
    assert push(core, 1, pull_next=True, bare_params=True) == []
    replies = push(core, 2, pull_next=True, bare_params=True)
    by_peer = {r.envelope[0]: r for r in replies}
    assert sorted(by_peer) == [_worker_peer(w) for w in range(3)] and len(replies) == 3
    expected = expected_after(SHARD, [grad(w) for w in range(3)])
    assert_params(by_peer[_worker_peer(0)], 1, expected, _worker_peer(0))
    bare = [by_peer[_worker_peer(w)] for w in (1, 2)]
    assert all(r.header == BARE and r.tensor is None for r in bare)
    assert bare[0].header is bare[1].header  # one header for all
    assert core.parked == {} and core.bare == set() and not core.parked_per_peer


def test_bare_params_without_pull_next_is_just_acked() -> None:
    core = make_core()
    assert only(push(core, 1, bare_params=True)).header == Ack(round=0, worker=1)
    assert core.parked == {} and core.bare == set()


def test_a_pull_of_a_round_parked_bare_replaces_it_with_a_full_reply() -> None:
    core = make_core()
    assert push(core, 1, pull_next=True, bare_params=True) == []
    assert pull(core, 1, peer=_worker_peer(1), worker=1) == []
    assert len(core.parked) == 1 and core.bare == set()
    assert core.counters == {"repeated-pull": 1}
    push(core, 0)
    replies = push(core, 2)
    expected = expected_after(SHARD, [grad(w) for w in range(3)])
    assert_params(only(replies[1:]), 1, expected, _worker_peer(1))


def test_a_bare_push_after_a_pull_of_the_same_round_makes_the_park_bare() -> None:
    """The last request for a (peer, round) says whether its reply is bare."""
    core = make_core()
    assert pull(core, 1, peer=_worker_peer(1), worker=1) == []
    assert push(core, 1, pull_next=True, bare_params=True, session=False) == []
    assert len(core.parked) == 1 and core.bare == {_parked_key(1, 1)}
    push(core, 0)
    reply = only(push(core, 2)[1:])
    assert reply.envelope == [_worker_peer(1)]
    assert reply.header == BARE and reply.tensor is None


def test_a_repeated_bare_push_of_an_open_round_makes_its_park_full() -> None:
    core = make_core()
    assert push(core, 0, pull_next=True, bare_params=True) == []
    assert push(core, 0, pull_next=True, bare_params=True) == []  # counted already
    assert len(core.parked) == 1 and core.bare == set()
    assert core.counters == {REPEATED_PUSH: 1}
    push(core, 1)
    replies = push(core, 2)
    expected = expected_after(SHARD, [grad(w) for w in range(3)])
    assert_params(only(replies[1:]), 1, expected, _worker_peer(0))


def test_a_repeated_bare_push_of_a_closed_round_is_answered_with_the_values() -> None:
    core = make_core()
    run_rounds(core, 1)
    after_0 = core.state.states[0].params.copy()
    replies = push(core, 1, round_=0, pull_next=True, bare_params=True)
    assert_params(only(replies), 1, after_0, _worker_peer(1))
    assert core.counters == {REPEATED_PUSH: 1} and core.bare == set()


def test_an_evicted_sessions_bare_park_is_forgotten_with_its_mark() -> None:
    core = make_core()
    assert push(core, 1, pull_next=True, bare_params=True) == []
    for i in range(MAX_SESSIONS_PER_PRINCIPAL):
        greet(core, b"impostor-%d" % i, "worker", 1)
    assert (_worker_peer(1),) not in core.sessions
    assert core.parked == {} and core.bare == set() and not core.parked_per_peer


def test_a_round_closed_at_its_deadline_answers_bare_parks_bare() -> None:
    core = make_core(cfg=CFG5, round_timeout="1.0", quorum=4)
    for w in range(4):
        assert push(core, w, pull_next=True, bare_params=w > 0, now=0.0) == []
    replies = core.tick(1.0)
    by_peer = {r.envelope[0]: r for r in replies}
    assert sorted(by_peer) == [_worker_peer(w) for w in range(4)] and len(replies) == 4
    assert by_peer[_worker_peer(0)].tensor is not None
    assert not by_peer[_worker_peer(0)].header.bare  # type: ignore[union-attr]
    assert all(by_peer[_worker_peer(w)].header == BARE for w in (1, 2, 3))
    assert all(by_peer[_worker_peer(w)].tensor is None for w in (1, 2, 3))
    assert core.bare == set()


# -- PULL ----------------------------------------------------------------------------


def test_pull_of_the_current_round_is_answered_at_once() -> None:
    core = make_core()
    assert_params(only(pull(core, 0)), 0, SHARD, b"reader")


def test_pull_of_a_kept_past_round_is_answered_from_history() -> None:
    core = make_core()
    run_rounds(core, 2)
    assert_params(only(pull(core, 0)), 0, SHARD, b"reader")


def test_pull_of_a_future_round_is_parked_until_that_round_exists() -> None:
    core = make_core()
    assert pull(core, 2, peer=b"early") == []
    run_rounds(core, 1)  # round 1 exists: not yet the one asked for
    assert len(core.parked) == 1
    push(core, 0)
    push(core, 1)
    replies = push(core, 2)
    assert replies[0].header == Ack(round=1, worker=2)
    assert_params(only(replies[1:]), 2, core.state.states[0].params, b"early")
    assert core.parked == {}


def test_pull_of_a_round_no_longer_kept_is_stale() -> None:
    core = make_core()
    run_rounds(core, 4)  # keeps rounds 1..4
    assert_error(pull(core, 0, peer=b"late"), ErrorCode.STALE_ROUND, 4, b"late")
    assert core.counters == {ErrorCode.STALE_ROUND.value: 1}


@pytest.mark.parametrize("round_", [5, 2**40])
def test_pull_past_the_last_round_is_wrong_round(round_: int) -> None:
    core = make_core()
    assert_error(pull(core, round_), ErrorCode.WRONG_ROUND, 0, b"reader")
    assert core.parked == {}
    assert core.counters == {ErrorCode.WRONG_ROUND.value: 1}


def test_parked_pulls_beyond_the_limit_are_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server.core, "MAX_PARKED", 3)
    core = make_core()
    for i in range(3):
        assert pull(core, 1, peer=b"p%d" % i) == []
    assert_error(pull(core, 1, peer=b"p3"), ErrorCode.BUSY, 0, b"p3")
    assert core.counters == {ErrorCode.BUSY.value: 1}
    assert len(core.parked) == 3
    assert_params(only(pull(core, 0, peer=b"p4")), 0, SHARD, b"p4")  # not parked: fine
    run_rounds(core, 1)  # releases the three
    assert core.parked == {}
    assert pull(core, 2, peer=b"p3") == []  # room again


def test_a_peer_may_wait_for_at_most_two_rounds() -> None:
    core = make_core()
    assert pull(core, 1, peer=b"early") == []
    assert pull(core, 2, peer=b"early") == []
    assert_error(pull(core, 3, peer=b"early"), ErrorCode.BUSY, 0, b"early")
    assert core.counters == {ErrorCode.BUSY.value: 1}
    assert pull(core, 3, peer=b"other") == []  # the limit is per peer
    run_rounds(core, 1)  # answers round 1: room for one more
    assert pull(core, 3, peer=b"early") == []
    assert len(core.parked) == 3


def test_repeated_pull_of_a_parked_round_replaces_it_without_growing() -> None:
    core = make_core()
    assert pull(core, 1, peer=b"early") == []
    assert pull(core, 2, peer=b"early") == []
    assert pull(core, 1, peer=b"early") == []  # the per-peer limit is reached: no error
    assert len(core.parked) == 2 and core.counters == {"repeated-pull": 1}
    replies = [r for _ in range(2) for r in run_rounds_replies(core)]
    params = [r for r in replies if isinstance(r.header, Params)]
    assert [r.header.round for r in params] == [1, 2]  # each answered once
    assert core.parked == {}


def test_pull_without_a_hello_is_refused_hello_first() -> None:
    core = make_core()
    replies = core.handle(message(Pull(round=1, worker=-1), peer=b"stranger"), 0.0)
    assert_error(replies, ErrorCode.HELLO_FIRST, 0, b"stranger")
    assert core.parked == {} and core.counters == {ErrorCode.HELLO_FIRST.value: 1}


# -- sessions and keys --------------------------------------------------------------


def keyed(core: ServerCore, header: Header, identity: Identity, peer: bytes,
          tensor: np.ndarray | None = None) -> list[Reply]:
    """``header`` sent by ``peer`` over a connection authenticated with ``identity``."""
    return core.handle(message(header, tensor, peer, identity), 0.0)


def test_a_worker_key_can_neither_hello_nor_push_as_another_worker() -> None:
    core = make_core()
    key = Identity("worker", 1)
    as_2 = Hello(role="worker", worker=2, config_hash=CFG.config_hash, config=CFG.to_dict())
    assert_error(keyed(core, as_2, key, b"w1"), ErrorCode.FORBIDDEN, 0, b"w1")
    as_1 = replace(as_2, worker=1)
    assert isinstance(only(keyed(core, as_1, key, b"w1")).header, Welcome)
    replies = keyed(core, Push(round=0, worker=2, length=5), key, b"w1", grad(2))
    assert_error(replies, ErrorCode.FORBIDDEN, 0, b"w1")
    assert core.counters == {ErrorCode.FORBIDDEN.value: 2}
    assert core.status().pushes == []
    replies = keyed(core, Push(round=0, worker=1, length=5), key, b"w1", grad(1))
    assert only(replies).header == Ack(round=0, worker=1)


def test_a_flood_of_hellos_as_one_worker_keeps_four_sessions_and_still_serves_it() -> None:
    core = make_core()
    real = _worker_peer(1)
    assert push(core, 1, pull_next=True) == []  # waits for round 1
    for i in range(50):
        greet(core, b"impostor-%d" % i, "worker", 1)
    assert len(core.sessions) == MAX_SESSIONS_PER_PRINCIPAL
    assert (real,) not in core.sessions
    assert core.parked == {} and not core.parked_per_peer  # the evicted peer's wait dropped
    assert_error(push(core, 1, session=False), ErrorCode.HELLO_FIRST, 0, real)
    # the worker says HELLO again (as its client does) and repeats its push
    assert push(core, 1, pull_next=True) == []
    push(core, 0)
    replies = push(core, 2)
    expected = expected_after(SHARD, [grad(w) for w in range(3)])
    assert_params(only(replies[1:]), 1, expected, real)
    assert len(core.sessions) == MAX_SESSIONS_PER_PRINCIPAL + 2  # workers 0 and 2


def test_an_evicted_evaluator_loses_its_parked_pulls_and_reader_mark() -> None:
    core = make_core()
    assert pull(core, 2, peer=EVALUATOR) == []
    assert (EVALUATOR,) in core.readers_waiting
    for i in range(MAX_SESSIONS_PER_PRINCIPAL):
        greet(core, b"evaluator-%d" % i, "evaluator", -1)
    assert (EVALUATOR,) not in core.sessions
    assert (EVALUATOR,) not in core.readers_waiting
    assert core.parked == {}


# -- internal errors -----------------------------------------------------------------


def test_an_exception_while_handling_is_answered_internal_and_the_core_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    core = make_core()
    params_at = core.state.states[0].params_at
    calls: list[int] = []

    def failing_once(round_: int) -> np.ndarray | None:
        calls.append(round_)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return params_at(round_)

    monkeypatch.setattr(core.state.states[0], "params_at", failing_once)
    with caplog.at_level(logging.ERROR, logger="ps.server"):
        error = assert_error(pull(core, 0), ErrorCode.INTERNAL, 0, b"reader")
    assert "RuntimeError: a bug" in error.message
    assert core.counters == {ErrorCode.INTERNAL.value: 1}
    assert any("internal error" in r.getMessage() for r in caplog.records)
    assert_params(only(pull(core, 0)), 0, SHARD, b"reader")
    run_rounds(core, 4)
    assert core.state.finished and core.counters == {ErrorCode.INTERNAL.value: 1}


# -- faults inside the core: what a failure in one step must not break ---------------


def test_a_round_whose_aggregation_raised_once_is_aggregated_after_a_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = make_core()
    aggregate = Defence.__call__
    calls: list[int] = []

    def failing_once(defence: Defence, grads: object, context: RoundContext) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("transient")
        return aggregate(defence, grads, context)

    monkeypatch.setattr(Defence, "__call__", failing_once)
    push(core, 0)
    push(core, 1)
    # the push is stored and acknowledged: the failure is the server's, counted and
    # logged, and the round stays open until the next push or tick closes it
    assert isinstance(only(push(core, 2)).header, Ack)
    assert core.state.round == 0 and core.counters == {ErrorCode.INTERNAL.value: 1}
    core.tick(0.0)
    assert core.state.round == 1


def test_parked_pulls_are_answered_even_if_writing_the_metrics_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = make_core()
    assert push(core, 0, pull_next=True) == []

    def disk_full(record: dict) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(core.metrics[0], "write", disk_full)
    push(core, 1)
    replies = push(core, 2)
    replies += push(core, 2)  # a retry after an ERROR reply
    assert any(r.envelope == [_worker_peer(0)] for r in replies)
    assert core.parked == {}


def test_push_of_a_negative_round_is_refused() -> None:
    core = make_core()
    assert isinstance(only(push(core, 0, round_=-1)).header, Error)


def test_pull_next_push_for_a_round_the_peer_already_waits_for_is_not_busy() -> None:
    core = make_core()
    peer = _worker_peer(0)
    assert pull(core, 1, peer=peer, worker=0) == []
    assert pull(core, 2, peer=peer, worker=0) == []
    assert push(core, 0, pull_next=True) == []


# -- STATUS --------------------------------------------------------------------------


def test_status_reports_round_pushes_and_counters() -> None:
    core = make_core()
    run_rounds(core, 1)
    push(core, 2)
    push(core, 0)
    push(core, 0)  # repeated
    reply = only(core.handle(message(Status(), peer=b"monitor"), 0.0))  # needs no HELLO
    assert reply.envelope == [b"monitor"]
    assert reply.header == StatusReply(shards=[0], round=1, rounds=4, finished=False,
                                       pushes=[0, 2], counters={REPEATED_PUSH: 1})


def test_status_of_a_finished_run() -> None:
    core = make_core()
    run_rounds(core, 4)
    status = only(core.handle(message(Status()), 0.0)).header
    assert isinstance(status, StatusReply)
    assert status.finished and status.round == 4 and status.pushes == []


# -- malformed and unexpected --------------------------------------------------------


def test_malformed_message_gets_a_malformed_error() -> None:
    core = make_core()
    error = assert_error(core.handle(garbage([b"peer"]), 0.0), ErrorCode.MALFORMED, 0, b"peer")
    assert "garbage" in error.message
    assert core.counters == {ErrorCode.MALFORMED.value: 1}


def test_malformed_message_without_envelope_gets_no_reply_but_is_counted() -> None:
    core = make_core()
    assert core.handle(garbage([]), 0.0) == []
    assert core.counters == {ErrorCode.MALFORMED.value: 1}


@pytest.mark.parametrize(
    ("header", "tensor"),
    [
        (Ack(round=0, worker=0), None),
        (Welcome(shards=[0], num_shards=2, d=10, length=5, round=0, rounds=4), None),
        (Error(code="duplicate", message="x", round=0), None),
        (StatusReply(shards=[0], round=0, rounds=4, finished=False, pushes=[], counters={}), None),
        (Params(round=0, shards=[0], length=5), np.zeros(5, dtype=np.float32)),
    ],
    ids=["ack", "welcome", "error", "status-reply", "params"],
)
def test_ops_a_server_does_not_accept_are_unexpected(header: Header,
                                                      tensor: np.ndarray | None) -> None:
    core = make_core()
    error = assert_error(core.handle(message(header, tensor), 0.0), ErrorCode.UNEXPECTED, 0)
    assert header.op.name in error.message
    assert core.counters == {ErrorCode.UNEXPECTED.value: 1}


# -- checkpoints ---------------------------------------------------------------------


def test_checkpoints_are_saved_every_k_rounds() -> None:
    saved: list[list[Checkpoint]] = []
    core = make_core(saved=saved)
    snapshots = {}
    for t in range(1, CFG.rounds + 1):
        run_rounds(core, 1)
        snapshots[t] = core.state.states[0].params.copy()
    assert [c.round for [c] in saved] == [2, 4]
    for [ckpt] in saved:
        assert ckpt.shard == 0 and ckpt.config_hash == CFG.config_hash
        np.testing.assert_array_equal(ckpt.params, snapshots[ckpt.round])


def test_checkpoint_every_zero_saves_only_on_demand() -> None:
    saved: list[list[Checkpoint]] = []
    core = make_core(saved=saved, checkpoint_every=0)
    run_rounds(core, 4)
    assert saved == []
    core.checkpoint()
    assert [c.round for [c] in saved] == [4]


def test_checkpoint_on_demand_saves_the_current_round() -> None:
    saved: list[list[Checkpoint]] = []
    core = make_core(saved=saved)
    run_rounds(core, 1)
    core.checkpoint()
    assert len(saved) == 1
    [ckpt] = saved[0]
    assert (ckpt.shard, ckpt.round, ckpt.config_hash) == (0, 1, CFG.config_hash)
    np.testing.assert_array_equal(saved[0][0].params, core.state.states[0].params)


def test_checkpoint_without_a_store_does_nothing() -> None:
    core = make_core()
    core.checkpoint()
    run_rounds(core, 2)
    assert core.counters == {}


def test_failing_checkpoint_is_counted_and_logged_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def failing_save(ckpts: list[Checkpoint]) -> None:
        raise OSError("disk full")

    core = ServerCore(CFG, ServerOptions(shard=0, checkpoint_every=2), INITIAL,
                      save=failing_save)
    with caplog.at_level(logging.ERROR, logger="ps.server"):
        run_rounds(core, 2)  # the save after round 2 fails
        core.checkpoint()  # and so does one on demand
    assert core.counters == {CHECKPOINT_FAILED: 2}
    assert core.state.round == 2  # the run goes on
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 2 and all("disk full" in r.getMessage() for r in failures)
    run_rounds(core, 2)  # retried at the next cadence
    assert core.counters == {CHECKPOINT_FAILED: 3} and core.state.finished


# -- done / tick / linger ------------------------------------------------------------


def test_not_done_before_the_last_round() -> None:
    core = make_core()
    run_rounds(core, 3)
    assert core.tick(1e9) == []
    assert not core.done(1e9)


def test_done_at_once_after_the_last_round_without_an_evaluator() -> None:
    core = make_core()
    hello(core, role="worker", worker=0)
    run_rounds(core, 4, now=100.0)
    assert core.done(100.0)


def test_lingers_for_an_evaluator_that_has_not_read_the_final_round() -> None:
    core = make_core()
    hello(core, role="evaluator", worker=-1, peer=EVALUATOR)
    run_rounds(core, 3)
    assert_params(only(pull(core, 3, peer=EVALUATOR)), 3, core.state.states[0].params, EVALUATOR)
    run_rounds(core, 1, now=100.0)
    assert core.tick(101.0) == []
    assert not core.done(100.0)
    assert not core.done(100.0 + LINGER_S - 0.01)
    assert core.done(100.0 + LINGER_S)


def test_round_0_waits_for_an_awaited_evaluator_then_closes_at_its_hello() -> None:
    """The evaluator ps-cluster starts may say HELLO after every worker pushed round 0 (a
    loaded host; the servers keep only a few past rounds): with ``await_evaluator`` round 0
    stays open until it has, so it reads the run's starting point."""
    core = make_core(await_evaluator=True)
    run_rounds(core, 1, now=100.0)
    assert core.state.complete and core.state.round == 0
    assert core.tick(100.0 + LINGER_S - 0.01) == [] and core.state.round == 0
    hello(core, role="evaluator", worker=-1, peer=EVALUATOR)
    core.tick(100.5)
    assert core.state.round == 1
    assert_params(only(pull(core, 0, peer=EVALUATOR)), 0, SHARD, EVALUATOR)
    run_rounds(core, 1, now=101.0)  # later rounds never wait
    assert core.state.round == 2


def test_round_0_waits_no_longer_than_the_linger_time_for_the_evaluator() -> None:
    """An evaluator that never comes costs round 0 the linger time, then the run goes on;
    and after the last round the server lingers for it again, ending once it reads it."""
    core = make_core(await_evaluator=True)
    run_rounds(core, 1, now=100.0)
    core.tick(100.0 + LINGER_S - 0.01)
    assert core.state.round == 0
    core.tick(100.0 + LINGER_S)
    assert core.state.round == 1
    finished = 200.0
    run_rounds(core, 3, now=finished)
    assert core.state.finished and not core.done(finished)
    assert not core.done(finished + LINGER_S - 0.01)
    hello(core, role="evaluator", worker=-1, peer=EVALUATOR)
    late = finished + LINGER_S / 2
    assert_params(only(pull(core, 4, peer=EVALUATOR, now=late)), 4,
                  core.state.states[0].params, EVALUATOR)
    assert core.done(late)


def test_awaiting_an_evaluator_that_never_comes_ends_with_the_linger_time() -> None:
    core = make_core(await_evaluator=True)
    run_rounds(core, 1, now=100.0)
    core.tick(100.0 + LINGER_S)
    run_rounds(core, 3, now=200.0)
    assert core.state.finished
    assert not core.done(200.0 + LINGER_S - 0.01)
    assert core.done(200.0 + LINGER_S)


def test_a_resumed_run_does_not_wait_for_the_evaluator() -> None:
    core = make_core(await_evaluator=True)
    core.restore([Checkpoint(0, 2, CFG.config_hash, SHARD.copy())])
    run_rounds(core, 1, now=100.0)
    assert core.state.round == 3


def test_done_at_once_when_the_evaluator_pulls_the_final_round() -> None:
    core = make_core()
    hello(core, role="evaluator", worker=-1, peer=EVALUATOR)
    run_rounds(core, 4, now=100.0)
    assert not core.done(100.0)
    assert_params(only(pull(core, 4, peer=EVALUATOR, now=101.0)), 4, core.state.states[0].params,
                  EVALUATOR)
    assert core.done(101.0)


def test_done_at_once_when_the_evaluator_was_parked_for_the_final_round() -> None:
    core = make_core()
    hello(core, role="evaluator", worker=-1, peer=EVALUATOR)
    run_rounds(core, 3)
    assert pull(core, 4, peer=EVALUATOR) == []
    push(core, 0, now=100.0)
    push(core, 1, now=100.0)
    replies = push(core, 2, now=100.0)
    assert_params(only(replies[1:]), 4, core.state.states[0].params, EVALUATOR)
    assert core.done(100.0)


def test_tick_marks_a_run_restored_at_its_last_round_finished() -> None:
    core = make_core()
    core.restore([Checkpoint(0, CFG.rounds, CFG.config_hash, SHARD.copy())])
    assert not core.done(10.0)  # not yet noticed
    assert core.tick(10.0) == []
    assert core.done(10.0)


# -- restore -------------------------------------------------------------------------


def test_restore_resumes_at_the_checkpoint_round_with_its_params() -> None:
    core = make_core()
    params = np.full(5, 3.0, dtype=np.float32)
    core.restore([Checkpoint(0, 2, CFG.config_hash, params)])
    welcome = only(hello(core)).header
    assert isinstance(welcome, Welcome) and welcome.round == 2
    assert_params(only(pull(core, 2)), 2, params, b"reader")
    assert_error(pull(core, 1), ErrorCode.STALE_ROUND, 2, b"reader")
    # every worker pushed round 1 (it was complete before the checkpoint): a repeat
    assert only(push(core, 0, round_=1)).header == Ack(round=1, worker=0)
    assert_error(push(core, 0, round_=0), ErrorCode.STALE_ROUND, 2, _worker_peer(0))
    run_rounds(core, 1)
    np.testing.assert_allclose(core.state.states[0].params,
                               expected_after(params, [grad(w, 2) for w in range(3)]))
    assert core.state.round == 3


@pytest.mark.parametrize(
    ("shard", "config_hash"),
    [(1, CFG.config_hash), (0, replace(CFG, lr=0.1).config_hash)],
    ids=["other-shard", "other-config"],
)
def test_restore_refuses_another_run_or_shard(shard: int, config_hash: str) -> None:
    core = make_core()
    with pytest.raises(ConfigError, match="checkpoint of shard"):
        core.restore([Checkpoint(shard, 2, config_hash, SHARD.copy())])
    assert core.state.round == 0


@pytest.mark.parametrize("size", [4, 6, 10])
def test_restore_refuses_params_of_another_size(size: int) -> None:
    core = make_core()
    with pytest.raises(ConfigError, match="values"):
        core.restore([Checkpoint(0, 2, CFG.config_hash, np.zeros(size, dtype=np.float32))])
    assert core.state.round == 0


@pytest.mark.parametrize("round_", [-1, 5])
def test_restore_refuses_a_round_outside_the_run(round_: int) -> None:
    core = make_core()
    with pytest.raises(ConfigError, match="round"):
        core.restore([Checkpoint(0, round_, CFG.config_hash, SHARD.copy())])


# -- metrics -------------------------------------------------------------------------


def test_metrics_hold_one_line_per_round(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    run_rounds(core, 4)
    core.metrics[0].close()
    records = read_jsonl(tmp_path / "m.jsonl")
    assert [r["round"] for r in records] == [0, 1, 2, 3]
    for r in records:
        assert r["shard"] == 0
        assert r["aggregation_ms"] >= 0
        assert r["nonfinite_values"] == 0
        assert r["params_finite"] is True
        assert r["errors"] == 0
    assert records[-1]["bytes_in"] == core.bytes_in > 0


def test_metrics_count_nonfinite_values_and_errors(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    push(core, 0, round_=3)  # wrong round: one error
    nan = grad(1)
    nan[2] = np.nan
    push(core, 0)
    push(core, 1, values=nan)
    push(core, 2)
    core.metrics[0].close()
    records = read_jsonl(tmp_path / "m.jsonl")
    assert len(records) == 1
    record = records[0]
    assert record["round"] == 0
    assert record["nonfinite_values"] == 1
    assert record["params_finite"] is False
    assert record["errors"] == 1
    params = core.state.states[0].params
    assert np.isnan(params[2]) and np.isfinite(np.delete(params, 2)).all()


def test_a_non_worker_cannot_claim_worker_ids_to_evict_the_workers_sessions() -> None:
    core = make_core()
    greet(core, _worker_peer(0), "worker", 0)
    for i in range(20):
        reply = only(hello(core, role="evaluator", worker=1000 + i, peer=f"e{i}".encode()))
        assert isinstance(reply.header, Error) and reply.header.code == "malformed"
    assert (_worker_peer(0),) in core.sessions


# -- round deadline and quorum (fake clock) ----------------------------------------------

CFG5 = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rule="marmed", q=1,
                 lr=0.5, rounds=4).validate()


def test_a_round_closes_at_its_deadline_with_the_quorum_it_has(tmp_path) -> None:
    core = make_core(tmp_path, cfg=CFG5, round_timeout="2.0", quorum=4)
    for w in range(4):
        ack = only(push(core, w, now=10.0 + w * 0.1))
        assert ack.header == Ack(round=0, worker=w)
    assert core.state.round == 0
    # counted from the round's (q + 1)-th push (q = 1: the second, at 10.1)
    assert core.deadline() == pytest.approx(12.1)
    assert core.tick(12.05) == []
    assert core.state.round == 0
    assert core.tick(12.1) == []  # (replies only to parked PULLs; none here)
    assert core.state.round == 1
    expected = SHARD - 0.5 * np.median(np.stack([grad(w) for w in range(4)]), axis=0)
    np.testing.assert_allclose(core.state.states[0].params, expected, rtol=1e-6)
    line = read_jsonl(tmp_path / "m.jsonl")[-1]
    assert line["workers"] == [0, 1, 2, 3] and line["missing"] == [4]
    # the late push of the closed round: stale-round with the current round
    assert_error(push(core, 4, round_=0, now=12.5), ErrorCode.STALE_ROUND, 1, _worker_peer(4))
    assert core.deadline() is None  # round 1 has no push yet: no clock runs


def test_past_its_deadline_a_round_waits_for_the_quorum_and_closes_at_it(caplog) -> None:
    core = make_core(cfg=CFG5, round_timeout="1.0", quorum=4)
    for w in range(3):
        push(core, w, pull_next=True, now=0.0)
    with caplog.at_level(logging.WARNING, logger="ps.server"):
        assert core.tick(5.0) == [] and core.tick(6.0) == []
    assert sum("waiting for the quorum of 4" in r.message for r in caplog.records) == 1
    replies = push(core, 3, pull_next=True, now=7.0)  # the 4th: closes at once
    assert core.state.round == 1
    assert sorted(r.envelope[0] for r in replies) == [_worker_peer(w) for w in range(4)]
    assert all(isinstance(r.header, Params) and r.header.round == 1 for r in replies)


def test_with_round_timeout_none_a_round_waits_for_all_n_forever() -> None:
    core = make_core(cfg=CFG5, round_timeout="none")
    for w in range(4):
        push(core, w, now=0.0)
    assert core.deadline() is None
    assert core.tick(1e9) == [] and core.state.round == 0
    push(core, 4, now=1e9)
    assert core.state.round == 1


def test_a_push_of_a_round_that_closed_without_it_is_stale_but_one_it_counted_repeats() -> None:
    core = make_core(cfg=CFG5, round_timeout="1.0", quorum=4)
    for w in range(4):
        push(core, w, now=0.0)
    core.tick(1.0)
    assert only(push(core, 2, round_=0, now=1.1)).header == Ack(round=0, worker=2)
    assert core.counters[REPEATED_PUSH] == 1
    assert_error(push(core, 4, round_=0, now=1.1), ErrorCode.STALE_ROUND, 1, _worker_peer(4))


@pytest.mark.parametrize(("options", "message"), [
    ({"quorum": 4, "round_timeout": "none"}, "needs a round deadline"),
    ({"round_timeout": "soon"}, "auto, none or seconds"),
    ({"round_timeout": "0"}, "positive number of seconds"),
    ({"round_timeout": "-1"}, "positive number of seconds"),
    ({"quorum": 3, "round_timeout": "1.0"}, "n - q..n = 4..5"),
    ({"quorum": 6, "round_timeout": "1.0"}, "n - q..n = 4..5"),
])
def test_a_quorum_the_run_cannot_use_is_a_configuration_error(options, message) -> None:
    with pytest.raises(ConfigError, match=message):
        ServerOptions(**options).check(CFG5)


def test_a_quorum_too_small_for_the_rule_names_both_numbers() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=7, num_shards=1, rule="krum", q=2,
                    rounds=2).validate()
    with pytest.raises(ConfigError, match=r"--quorum 5: rule krum cannot aggregate 5 rows"):
        ServerOptions(quorum=5, round_timeout="1.0").check(cfg)
    assert ServerOptions(quorum=7, round_timeout="1.0").check(cfg).quorum == 7


def test_an_evaluator_that_reconnected_is_waited_for_on_its_new_socket_only() -> None:
    core = make_core()
    greet(core, EVALUATOR, "evaluator", -1)
    greet(core, b"evaluator-again", "evaluator", -1)  # it reopened its socket
    assert core.readers_waiting == {(b"evaluator-again",)}


def test_a_checkpoint_keeps_the_round_before_and_a_restored_core_serves_it(tmp_path) -> None:
    from server.checkpoint import Expected, load_checkpoint, save_checkpoint

    core = make_core()
    for w in range(3):
        push(core, w)
    saved = core.snapshot()[0]
    assert saved.round == 1 and saved.previous is not None
    save_checkpoint(tmp_path / "c.npz", saved, key=None)
    resumed = make_core()
    resumed.restore([load_checkpoint(tmp_path / "c.npz", key=None,
                                     expect=Expected.of(CFG, 0, size=saved.params.size))])
    # a shard that lagged by one round still gets round 0 from its workers, who need
    # x^0 of this shard to compute it: it is still served, and their pushes repeat
    assert_params(only(pull(resumed, 0)), 0, SHARD, b"reader")
    assert only(push(resumed, 1, round_=0)).header == Ack(round=0, worker=1)


def test_the_late_push_of_a_last_round_closed_without_it_is_stale_not_finished() -> None:
    cfg = replace(CFG5, rounds=1)
    core = make_core(cfg=cfg, round_timeout="1.0", quorum=4)
    for w in range(4):
        push(core, w, now=0.0)
    core.tick(1.0)
    assert core.state.finished
    assert_error(push(core, 4, round_=0, now=1.5), ErrorCode.STALE_ROUND, 1, _worker_peer(4))
