"""The proxy's behaviour without sockets (``ps/proxy/core.py``): what each message becomes.

Messages are built as the transport would hand them over: a worker's request on the
ROUTER front and the server's reply on the DEALER back both carry the worker's
envelope (``[b"w<i>"]``) in front of the empty delimiter. The core's idea of the
server's round starts at the WELCOME's (0 here unless said) and follows the replies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

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
    Welcome,
    decode,
    encode,
    split_envelope,
)
from common.net.transport import Incoming
from common.run.config import AttackConfig, RunConfig
from common.run.metrics import JsonlWriter, read_jsonl
from ps.proxy import core as proxy_core
from ps.proxy.core import Outgoing, ProxyCore
from ps.proxy.corruption import ShardCorruptor

# --------------------------------------------------------------------------- setup

CFG = RunConfig(dataset="synthetic", num_workers=4, num_shards=2, rule="marmed", q=1,
                rounds=3, seed=5).validate()
WELCOME = Welcome(shards=[1], num_shards=2, d=200, length=100, round=0, rounds=3)
N = CFG.num_workers
LENGTH = WELCOME.length  # 100 values per push / PARAMS of shard 1
PAPER_MASK = np.uint32((1 << 21) | (1 << 29) | (1 << 30) | (1 << 31))

GAMBLER = {"proxy_attack": "gambler", "gambler_p": 0.5}
OMNISCIENT = {"proxy_attack": "omniscient", "proxy_victims": (0, 2), "omniscient_scale": 10.0}
GAUSSIAN = {"proxy_attack": "gaussian", "proxy_victims": (3,)}
BITFLIP = {"proxy_attack": "bitflip", "bitflip_coords": 150}


def attack(**given: Any) -> AttackConfig:
    """A validated proxy attack on shard 1."""
    return AttackConfig.build(proxy_shards=(1,), **given).validate(CFG)


def make_core(attack_cfg: AttackConfig, metrics: JsonlWriter | None = None,
              welcome: Welcome = WELCOME) -> ProxyCore:
    return ProxyCore(CFG, attack_cfg, welcome, metrics)


def reference(attack_cfg: AttackConfig) -> ShardCorruptor:
    """A corruptor for the same shard, to compare the core's output with."""
    return ShardCorruptor(CFG, attack_cfg, 1, 100, 200)


# --------------------------------------------------------------------------- messages


def env(worker: int) -> list[bytes]:
    """The routing envelope of worker ``worker``'s connection."""
    return [f"w{worker}".encode()]


def _size(frames: Sequence[Any]) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def incoming(envelope: list[bytes], header: Header, tensor: np.ndarray | None = None,
             identity: Identity | None = None) -> Incoming:
    """A decoded message behind ``envelope`` (front: from a worker; back: from the server),
    sent with the key of ``identity`` (None: no keys in use)."""
    body = encode(header, tensor)
    frames = [*envelope, b"", *body]
    return Incoming(envelope=list(envelope), message=decode(body), error=None, frames=frames,
                    size=_size(frames), identity=identity)


def garbage(envelope: list[bytes], error: ProtocolError | None = None) -> Incoming:
    """Frames that could not be decoded (``error``: what the decoder said)."""
    frames = [*envelope, b"garbage"]
    return Incoming(envelope=list(envelope), message=None, error=error or ProtocolError("x"),
                    frames=frames, size=_size(frames))


def grad(worker: int, round_: int = 0) -> np.ndarray:
    """Worker ``worker``'s gradient shard for ``round_`` (deterministic, finite; invalid
    ids and rounds, which are negative, included)."""
    rng = np.random.default_rng([abs(round_), abs(worker)])
    return rng.standard_normal(LENGTH).astype(np.float32)


def push(worker: int, round_: int = 0, pull_next: bool = False, *, length: int = LENGTH,
         identity: Identity | None = None, bare_params: bool = False) -> Incoming:
    """Worker ``worker``'s push (``length`` values: other than LENGTH, the wrong size)."""
    header = Push(round=round_, worker=worker, length=length, pull_next=pull_next,
                  bare_params=bare_params)
    return incoming(env(worker), header, np.resize(grad(worker, round_), length), identity)


def server_says(header: Header) -> Incoming:
    """The server's reply without a payload (ACK, ERROR), routed back to worker 2."""
    return incoming(env(2), header)


def params_values(round_: int) -> np.ndarray:
    return np.random.default_rng([99, round_]).standard_normal(LENGTH).astype(np.float32)


def params_reply(envelope: list[bytes], round_: int) -> Incoming:
    """The server's PARAMS(round_) reply, routed back to ``envelope``."""
    header = Params(round=round_, shards=[1], length=LENGTH)
    return incoming(envelope, header, params_values(round_))


def sent(out: Outgoing) -> tuple[list[bytes], Header, np.ndarray | None]:
    """(envelope, header, tensor or None) of frames the core sends."""
    envelope, body = split_envelope(out.frames)
    msg = decode(body)
    tensor = np.array(msg.tensor()) if msg.chunks else None
    return [bytes(f) for f in envelope], msg.header, tensor


def as_bytes(frames: Sequence[Any]) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def forward_all(core: ProxyCore, pushes: Sequence[Incoming]) -> list[Outgoing]:
    out: list[Outgoing] = []
    for p in pushes:
        out += core.from_worker(p)
    return out


def assert_refused(out: list[Outgoing], code: ErrorCode, round_: int = 0,
                   envelope: list[bytes] | None = None) -> None:
    """``out`` is only an ERROR ``code`` back to the sender, stating the server's round."""
    assert len(out) == 1 and not out[0].to_server
    got_envelope, header, tensor = sent(out[0])
    assert isinstance(header, Error) and tensor is None, header
    assert (header.code, header.round) == (code.value, round_), header
    if envelope is not None:
        assert got_envelope == envelope


def assert_relayed_unchanged(out: list[Outgoing], msg: Incoming) -> None:
    """``out`` is ``msg``, byte for byte, on its way to the server."""
    assert len(out) == 1 and out[0].to_server
    assert as_bytes(out[0].frames) == as_bytes(msg.frames)


# --------------------------------------------------------------------------- gambler


def test_gambler_forwards_each_push_at_once_corrupted_as_the_corruptor_says() -> None:
    a = attack(**GAMBLER)
    core, ref = make_core(a), reference(a)
    for worker in range(N):
        out = core.from_worker(push(worker, round_=1))
        assert len(out) == 1 and out[0].to_server
        envelope, header, values = sent(out[0])
        assert envelope == env(worker)
        assert header == Push(round=1, worker=worker, length=LENGTH)
        expected, changed = ref.corrupt_push(1, worker, grad(worker, 1))
        assert changed > 0
        np.testing.assert_array_equal(bits(values), bits(expected))
        assert np.count_nonzero(bits(values) != bits(grad(worker, 1))) == changed


def test_gambler_corruption_does_not_depend_on_arrival_order() -> None:
    a = attack(**GAMBLER)
    keys = [(r, w) for r in (0, 1) for w in range(N)]

    def run(order: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        core = make_core(a)
        result = {}
        for r, w in order:
            (out,) = core.from_worker(push(w, round_=r))
            result[(r, w)] = bits(sent(out)[2]).tobytes()
        return result

    forward, backward = run(keys), run(keys[::-1])
    assert forward == backward
    assert len(set(forward.values())) == len(keys)  # each (round, worker) its own draws


# --------------------------------------------------------------------------- omniscient


def test_omniscient_holds_a_round_and_releases_it_in_worker_order() -> None:
    core = make_core(attack(**OMNISCIENT))
    arrival = [2, 0, 3, 1]
    for worker in arrival[:-1]:
        assert core.from_worker(push(worker)) == []
    out = core.from_worker(push(arrival[-1]))
    assert [o.to_server for o in out] == [True] * N
    for worker, o in enumerate(out):
        envelope, header, _ = sent(o)
        assert envelope == env(worker)
        assert header == Push(round=0, worker=worker, length=LENGTH)
    assert not core.tables.held


def test_omniscient_replaces_victims_by_minus_scale_times_sum_of_honest_rows() -> None:
    core = make_core(attack(**OMNISCIENT))
    out = forward_all(core, [push(w) for w in range(N)])
    values = {sent(o)[1].worker: sent(o)[2] for o in out}
    forged = (grad(1) + grad(3)) * np.float32(-10.0)
    for victim in (0, 2):
        np.testing.assert_array_equal(values[victim], forged)
    for honest in (1, 3):
        np.testing.assert_array_equal(bits(values[honest]), bits(grad(honest)))


def test_omniscient_writes_one_metrics_line_per_round(tmp_path) -> None:
    metrics = JsonlWriter(tmp_path / "p.jsonl")
    core = make_core(attack(**OMNISCIENT), metrics)
    forward_all(core, [push(w) for w in range(N)])
    assert_refused(core.from_worker(garbage(env(1))), ErrorCode.MALFORMED, round_=1)
    forward_all(core, [push(w, round_=1) for w in range(N)])
    metrics.close()
    lines = read_jsonl(tmp_path / "p.jsonl")
    assert [line["round"] for line in lines] == [0, 1]
    assert [line["pushes"] for line in lines] == [N, N]
    assert [line["corrupted_values"] for line in lines] == [2 * LENGTH, 2 * LENGTH]
    assert [line["errors"] for line in lines] == [0, 1]  # refusals so far


def test_a_round_the_server_closed_without_some_workers_still_gets_its_line(tmp_path) -> None:
    """Absent workers never push: the line of a round is written once the server moved
    past it (it used to wait for n pushes, so a quorum run's proxy wrote none)."""
    metrics = JsonlWriter(tmp_path / "p.jsonl")
    core = make_core(attack(**GAMBLER), metrics)
    forward_all(core, [push(w) for w in range(N - 1)])
    core.from_server(server_says(Ack(round=1, worker=0)))  # the server is at round 1
    metrics.close()
    [line] = read_jsonl(tmp_path / "p.jsonl")
    assert line["round"] == 0 and line["pushes"] == N - 1 and line["counters"] == {}


def test_omniscient_drops_held_pushes_of_a_round_the_server_has_left() -> None:
    core = make_core(attack(**OMNISCIENT))
    forward_all(core, [push(0, round_=0), push(1, round_=0)])
    core.from_server(server_says(Ack(round=1, worker=2)))  # the server is at round 1
    assert not core.tables.held  # round 0 can no longer complete here: its pushes are relayed
    forward_all(core, [push(0, round_=0), push(3, round_=2)])
    assert set(core.tables.held) == {2}
    out = forward_all(core, [push(w, round_=1) for w in range(N)])
    assert [sent(o)[1].round for o in out] == [1] * N
    assert set(core.tables.held) == {2}  # round 0 can no longer complete; round 2 still can
    assert set(core.tables.held[2]) == {3}
    assert_refused(core.from_worker(push(0, round_=4)), ErrorCode.WRONG_ROUND, round_=2)


def test_held_pushes_never_span_more_than_the_current_and_the_next_round() -> None:
    core = make_core(attack(**OMNISCIENT))
    forward_all(core, [push(0, round_=0), push(1, round_=0)])
    core.from_server(server_says(Ack(round=1, worker=2)))
    forward_all(core, [push(0, round_=1), push(0, round_=2)])
    assert set(core.tables.held) == {1, 2}


def test_a_server_that_went_back_leaves_nothing_held_or_tallied_for_later_rounds(
    tmp_path,
) -> None:
    metrics = JsonlWriter(tmp_path / "p.jsonl")
    core = make_core(attack(**GAMBLER), metrics)
    core.from_server(server_says(Ack(round=1, worker=2)))
    forward_all(core, [push(0, round_=1), push(1, round_=1)])
    core.from_server(server_says(Error(code="wrong-round", message="", round=0)))
    assert core.round == 0 and set(core.tables.tallies) == set()
    forward_all(core, [push(w, round_=0) for w in range(N)])
    forward_all(core, [push(0, round_=1), push(1, round_=1)])
    metrics.close()
    lines = read_jsonl(tmp_path / "p.jsonl")
    assert [line["round"] for line in lines] == [0]  # round 1 has 2 of 4 pushes, not 4
    held = make_core(attack(**OMNISCIENT))
    held.from_server(server_says(Ack(round=1, worker=2)))
    forward_all(held, [push(0, round_=1), push(0, round_=2)])
    held.from_server(server_says(Error(code="wrong-round", message="", round=0)))
    assert set(held.tables.held) == set()


# --------------------------------------------------------------------------- gaussian


def test_gaussian_replaces_only_the_victims_push_at_once() -> None:
    a = attack(**GAUSSIAN)
    core, ref = make_core(a), reference(a)
    for worker in range(N):
        (out,) = core.from_worker(push(worker))
        envelope, header, values = sent(out)
        assert out.to_server and envelope == env(worker) and header.worker == worker
        assert header == Push(round=0, worker=worker, length=LENGTH)
        if worker == 3:
            assert np.isfinite(values).all()
            assert not np.any(values == grad(worker))
            np.testing.assert_array_equal(values, ref.corrupt_push(0, 3, grad(3))[0])
        else:
            np.testing.assert_array_equal(bits(values), bits(grad(worker)))


# --------------------------------------------------------------------------- bitflip


def test_bitflip_flips_each_of_the_shards_first_coordinates_in_exactly_one_worker() -> None:
    core = make_core(attack(**BITFLIP))
    flipped = np.zeros((N, LENGTH), dtype=bool)
    for worker in range(N):
        (out,) = core.from_worker(push(worker))
        xor = bits(sent(out)[2]) ^ bits(grad(worker))
        assert (xor[xor != 0] == PAPER_MASK).all()
        flipped[worker] = xor != 0
    in_range = 150 - 100  # global coordinates 100..149 = local 0..49
    assert (flipped[:, :in_range].sum(axis=0) == 1).all()
    assert not flipped[:, in_range:].any()


# --------------------------------------------------------------------------- PARAMS


@pytest.mark.parametrize("given", [GAMBLER, BITFLIP], ids=["gambler", "bitflip"])
def test_params_are_corrupted_for_the_worker_that_asked(given: dict[str, Any]) -> None:
    a = attack(corrupt_params=True, **given)
    core, ref = make_core(a), reference(a)
    assert core.from_worker(incoming(env(1), Pull(round=1, worker=1))) != []
    assert core.from_worker(push(2, round_=0, pull_next=True)) != []
    replies = {}
    for worker in (1, 2):
        (out,) = core.from_server(params_reply(env(worker), 1))
        envelope, header, values = sent(out)
        assert not out.to_server and envelope == env(worker)
        assert header == Params(round=1, shards=[1], length=LENGTH)
        expected, changed = ref.corrupt_params(1, worker, params_values(1))
        assert changed > 0
        np.testing.assert_array_equal(bits(values), bits(expected))
        replies[worker] = bits(values)
    assert not np.array_equal(replies[1], replies[2])


@pytest.mark.parametrize("given", [GAMBLER, BITFLIP], ids=["gambler", "bitflip"])
def test_params_for_an_evaluator_are_never_corrupted(given: dict[str, Any], tmp_path) -> None:
    metrics = JsonlWriter(tmp_path / "p.jsonl")
    core = make_core(attack(corrupt_params=True, **given), metrics)
    evaluator = [b"eval"]
    (pull,) = core.from_worker(incoming(evaluator, Pull(round=1, worker=-1)))
    assert pull.to_server
    (out,) = core.from_server(params_reply(evaluator, 1))
    envelope, header, values = sent(out)
    assert not out.to_server and envelope == evaluator
    assert header == Params(round=1, shards=[1], length=LENGTH)
    np.testing.assert_array_equal(bits(values), bits(params_values(1)))
    metrics.close()
    assert read_jsonl(tmp_path / "p.jsonl") == []


@pytest.mark.parametrize("given", [GAMBLER, BITFLIP], ids=["gambler", "bitflip"])
def test_params_are_relayed_byte_identical_without_corrupt_params(given: dict[str, Any]) -> None:
    core = make_core(attack(**given))
    core.from_worker(incoming(env(1), Pull(round=1, worker=1)))
    reply = params_reply(env(1), 1)
    (out,) = core.from_server(reply)
    assert not out.to_server
    assert as_bytes(out.frames) == as_bytes(reply.frames)


# --------------------------------------------------------------------------- bare PARAMS


def bare_push(worker: int, round_: int = 0) -> Incoming:
    return push(worker, round_, pull_next=True, bare_params=True)


def bare_params_reply(envelope: list[bytes], round_: int) -> Incoming:
    return incoming(envelope, Params(round=round_, shards=[1], length=LENGTH, bare=True))


@pytest.mark.parametrize("given", [GAMBLER, BITFLIP], ids=["gambler", "bitflip"])
def test_with_corrupt_params_a_bare_push_goes_on_asking_for_the_values(
    given: dict[str, Any],
) -> None:
    core = make_core(attack(corrupt_params=True, **given))
    out = forward_all(core, [bare_push(w) for w in range(N)])
    assert len(out) == N and all(o.to_server for o in out)
    for o in out:
        envelope, header, _ = sent(o)
        assert header == Push(round=0, worker=header.worker, length=LENGTH, pull_next=True)
        assert not header.bare_params and envelope == env(header.worker)


def test_with_corrupt_params_an_older_rounds_bare_push_asks_for_the_values_too() -> None:
    """Relayed uncorrupted (the server answers it as a repeat), but never bare: its
    reply is this worker's to corrupt."""
    core = make_core(attack(corrupt_params=True, **GAMBLER))
    core.from_server(server_says(Ack(round=1, worker=0)))  # the server is at round 1
    (out,) = core.from_worker(bare_push(2, round_=0))
    envelope, header, values = sent(out)
    assert out.to_server and envelope == env(2)
    assert header == Push(round=0, worker=2, length=LENGTH, pull_next=True)
    np.testing.assert_array_equal(values, sent(forward_all(make_core(attack()), [
        push(2, pull_next=True)])[0])[2])  # the values as pushed


@pytest.mark.parametrize("given", [GAMBLER, OMNISCIENT], ids=["gambler", "omniscient"])
def test_without_corrupt_params_a_bare_push_still_asks_for_a_bare_reply(
    given: dict[str, Any],
) -> None:
    a = attack(**given)
    core = make_core(a)
    out = forward_all(core, [bare_push(w) for w in range(N)])
    assert len(out) == N
    assert all(sent(o)[1].bare_params for o in out)  # type: ignore[union-attr]
    plain = make_core(a)
    forwarded = forward_all(plain, [push(w, pull_next=True) for w in range(N)])
    for got, expected in zip(out, forwarded, strict=True):  # corrupted all the same
        np.testing.assert_array_equal(bits(sent(got)[2]), bits(sent(expected)[2]))


def test_a_bare_push_is_corrupted_and_routed_like_any_other() -> None:
    a = attack(corrupt_params=True, **GAMBLER)
    core, ref = make_core(a), reference(a)
    (out,) = core.from_worker(bare_push(2))
    expected, changed = ref.corrupt_push(0, 2, grad(2))
    assert changed > 0
    np.testing.assert_array_equal(bits(sent(out)[2]), bits(expected))
    (back,) = core.from_server(params_reply(env(2), 1))  # the values it asked for instead
    np.testing.assert_array_equal(bits(sent(back)[2]),
                                  bits(ref.corrupt_params(1, 2, params_values(1))[0]))


@pytest.mark.parametrize("corrupt_params", [True, False])
def test_a_bare_params_reply_is_relayed_as_it_is(corrupt_params: bool, tmp_path) -> None:
    metrics = JsonlWriter(tmp_path / "p.jsonl")
    core = make_core(attack(corrupt_params=corrupt_params, **GAMBLER), metrics)
    core.from_worker(bare_push(1))
    reply = bare_params_reply(env(1), 1)
    (out,) = core.from_server(reply)
    assert not out.to_server and as_bytes(out.frames) == as_bytes(reply.frames)
    assert core.round == 1  # it still tells the server's round
    metrics.close()
    assert not any("params_corrupted" in line for line in read_jsonl(tmp_path / "p.jsonl"))


# --------------------------------------------------------------------------- relaying


def test_undecodable_frames_from_the_server_go_to_the_worker_unchanged() -> None:
    core = make_core(attack(**GAMBLER))
    msg = garbage(env(1))
    assert core.from_server(msg) == [Outgoing(False, msg.frames)]
    assert not core.counters


def test_a_late_reply_to_the_proxys_own_hello_is_dropped() -> None:
    core = make_core(attack(**GAMBLER))
    assert core.from_server(incoming([], WELCOME)) == []


@pytest.mark.parametrize("header", [
    Hello(role="worker", worker=1, config_hash=CFG.config_hash, config=CFG.to_dict()),
    Status(),
    Pull(round=0, worker=1),
], ids=["hello", "status", "pull"])
def test_requests_without_a_payload_are_relayed_unchanged(header: Header) -> None:
    core = make_core(attack(**GAMBLER))
    msg = incoming(env(1), header)
    assert core.from_worker(msg) == [Outgoing(True, msg.frames)]


def test_a_proxy_without_attack_relays_every_push_unchanged() -> None:
    core = make_core(attack(proxy_attack="none", corrupt_params=False))
    for worker in range(N):
        [out] = core.from_worker(push(worker, pull_next=True))
        envelope, header, values = sent(out)
        assert out.to_server and envelope == env(worker) and header.worker == worker
        np.testing.assert_array_equal(values, grad(worker))
    [reply] = core.from_server(params_reply(env(1), 1))
    np.testing.assert_array_equal(sent(reply)[2], params_values(1))


# --------------------------------------------------------------------------- refusals

# What the server would refuse, the proxy answers itself with the server's code, before
# corrupting or holding anything, and counts it.


@pytest.mark.parametrize("error", [ProtocolError("x"), ProtocolError("big", ErrorCode.TOO_LARGE)],
                         ids=["malformed", "too-large"])
def test_undecodable_frames_from_a_worker_are_refused_with_the_decoders_code(
    error: ProtocolError,
) -> None:
    core = make_core(attack(**GAMBLER))
    assert_refused(core.from_worker(garbage(env(1), error)), error.code, envelope=env(1))
    assert core.counters == {error.code.value: 1}


@pytest.mark.parametrize("given", [GAMBLER, OMNISCIENT], ids=["gambler", "omniscient"])
@pytest.mark.parametrize(("worker", "round_", "length", "code"), [
    (-1, 0, LENGTH, ErrorCode.UNKNOWN_WORKER),
    (N, 0, LENGTH, ErrorCode.UNKNOWN_WORKER),
    (1, -1, LENGTH, ErrorCode.STALE_ROUND),
    (1, CFG.rounds, LENGTH, ErrorCode.FINISHED),
    (1, CFG.rounds + 1, LENGTH, ErrorCode.WRONG_ROUND),
    (1, 2, LENGTH, ErrorCode.WRONG_ROUND),  # the server is at round 0: 2 is too far ahead
    (1, 0, LENGTH - 1, ErrorCode.WRONG_LENGTH),
    (1, 1, LENGTH + 1, ErrorCode.WRONG_LENGTH),
], ids=["worker-minus-1", "worker-n", "round-minus-1", "round-rounds", "round-past-rounds",
        "round-plus-2", "too-short", "too-long"])
def test_a_push_the_server_would_refuse_is_refused_by_the_proxy(
    given: dict[str, Any], worker: int, round_: int, length: int, code: ErrorCode,
) -> None:
    core = make_core(attack(**given))
    msg = push(worker, round_, length=length)
    assert_refused(core.from_worker(msg), code, envelope=env(worker))
    assert core.counters == {code.value: 1}
    assert not core.tables.held and not core.tables.tallies


@pytest.mark.parametrize("identity", [Identity("worker", 1), Identity("evaluator"),
                                      Identity("proxy", 0), Identity("proxy", 1)],
                         ids=["another-worker", "evaluator", "its-own-proxy-key",
                              "another-proxy-key"])
def test_a_key_cannot_push_through_the_proxy_as_another_worker(identity: Identity) -> None:
    core = make_core(attack(**OMNISCIENT))
    assert_refused(core.from_worker(push(2, identity=identity)), ErrorCode.FORBIDDEN)
    assert core.counters == {"forbidden": 1} and not core.tables.held


def test_a_push_under_its_own_workers_key_is_relayed() -> None:
    a = attack(**GAMBLER)
    core = make_core(a)
    (out,) = core.from_worker(push(2, identity=Identity("worker", 2)))
    assert out.to_server
    expected, _ = reference(a).corrupt_push(0, 2, grad(2))
    np.testing.assert_array_equal(bits(sent(out)[2]), bits(expected))
    assert not core.counters


def test_a_refused_push_leaves_the_held_round_to_complete() -> None:
    core = make_core(attack(**OMNISCIENT))
    assert forward_all(core, [push(0), push(2), push(3)]) == []
    assert_refused(core.from_worker(push(1, length=LENGTH - 1)), ErrorCode.WRONG_LENGTH)
    assert set(core.tables.held[0]) == {0, 2, 3}
    out = core.from_worker(push(1))
    assert [sent(o)[1].worker for o in out] == list(range(N))


def test_an_exception_while_handling_is_answered_internal_and_the_proxy_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = attack(**GAMBLER)
    core = make_core(a)

    def bug(*args: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(core.corruptor, "corrupt_push", bug)
    assert_refused(core.from_worker(push(0)), ErrorCode.INTERNAL, envelope=env(0))
    assert core.counters == {"internal": 1}
    monkeypatch.undo()
    (out,) = core.from_worker(push(0))
    assert out.to_server
    expected, _ = reference(a).corrupt_push(0, 0, grad(0))
    np.testing.assert_array_equal(bits(sent(out)[2]), bits(expected))
    assert core.counters == {"internal": 1}


# --------------------------------------------------------------------------- the server's round


@pytest.mark.parametrize("given", [GAMBLER, OMNISCIENT], ids=["gambler", "omniscient"])
@pytest.mark.parametrize("told_by", ["welcome", "ack", "params"])
def test_pushes_of_rounds_the_server_has_left_go_through_uncorrupted(
    given: dict[str, Any], told_by: str,
) -> None:
    welcome = replace(WELCOME, round=2) if told_by == "welcome" else WELCOME
    core = make_core(attack(**given), welcome=welcome)
    if told_by == "ack":
        core.from_server(server_says(Ack(round=2, worker=2)))
    elif told_by == "params":
        core.from_server(params_reply(env(2), 2))
    assert core.round == 2
    for round_ in (0, 1):  # the server answers these (repeats, stale): not held, not forged
        for worker in range(N):
            msg = push(worker, round_)
            assert_relayed_unchanged(core.from_worker(msg), msg)
    assert not core.tables.held and not core.counters


def test_the_proxy_follows_the_round_the_servers_replies_state() -> None:
    core = make_core(attack(**GAMBLER), welcome=replace(WELCOME, round=1))
    assert core.round == 1
    core.from_server(server_says(Ack(round=2, worker=2)))
    assert core.round == 2
    core.from_server(server_says(Ack(round=1, worker=2)))  # an older ACK says nothing new
    core.from_server(params_reply(env(2), 1))
    assert core.round == 2
    error = server_says(Error(code="wrong-round", message="restarted", round=1))
    assert core.from_server(error) == [Outgoing(False, error.frames)]
    assert core.round == 1  # lower: the server restarted from a checkpoint


def test_a_server_error_with_an_older_round_makes_the_proxy_corrupt_that_round_again() -> None:
    a = attack(**GAMBLER)
    core = make_core(a)
    core.from_server(server_says(Ack(round=2, worker=2)))
    stale = push(1, round_=0)
    assert_relayed_unchanged(core.from_worker(stale), stale)
    core.from_server(server_says(Error(code="wrong-round", message="", round=0)))
    assert core.round == 0
    (out,) = core.from_worker(push(1, round_=0))
    assert out.to_server
    expected, changed = reference(a).corrupt_push(0, 1, grad(1))
    assert changed > 0
    np.testing.assert_array_equal(bits(sent(out)[2]), bits(expected))
    assert_refused(core.from_worker(push(1, round_=2)), ErrorCode.WRONG_ROUND)


# --------------------------------------------------------------------------- bounds


def test_held_pushes_are_only_of_the_servers_round_and_the_next() -> None:
    core = make_core(attack(**OMNISCIENT))
    rounds = range(CFG.rounds)
    assert forward_all(core, [push(w, 0) for w in range(N - 1)]) == []
    for r in rounds:
        assert core.round == r
        if r + 1 in rounds:
            assert forward_all(core, [push(w, r + 1) for w in range(N - 1)]) == []
        too_far = r + 2
        code = ErrorCode.FINISHED if too_far == CFG.rounds else ErrorCode.WRONG_ROUND
        assert_refused(core.from_worker(push(0, too_far)), code, round_=r)
        assert set(core.tables.held) == {r, r + 1} & set(rounds)
        assert [sent(o)[1].round for o in core.from_worker(push(N - 1, r))] == [r] * N
    assert not core.tables.held and core.round == CFG.rounds


def test_reply_routes_are_bounded_the_oldest_forgotten_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(proxy_core, "MAX_ROUTES", 3)
    a = attack(corrupt_params=True, **GAMBLER)
    core = make_core(a)
    peers = [[f"p{i}".encode()] for i in range(10)]
    for i, peer in enumerate(peers):
        (out,) = core.from_worker(incoming(peer, Pull(round=1, worker=i % N)))
        assert out.to_server
        assert len(core.tables.puller) <= 3
    assert list(core.tables.puller) == [tuple(p) for p in peers[-3:]]
    (newest,) = core.from_server(params_reply(peers[9], 1))  # for worker 9 % N == 1
    expected, _ = reference(a).corrupt_params(1, 1, params_values(1))
    np.testing.assert_array_equal(bits(sent(newest)[2]), bits(expected))
    forgotten = params_reply(peers[0], 1)  # nobody to corrupt for: relayed as it came
    (out,) = core.from_server(forgotten)
    assert as_bytes(out.frames) == as_bytes(forgotten.frames)


@pytest.mark.parametrize("header", [Pull(round=1, worker=1),
                                    Push(round=0, worker=1, length=LENGTH)])
def test_a_message_behind_made_up_routing_frames_is_refused_and_leaves_no_route(
        header: Header) -> None:
    """A worker's DEALER adds no routing frame: each made-up one would be a new peer, a
    reply route of its own (one key could push every honest worker's out of the table),
    and would take the message a frame deeper at the server."""
    core = make_core(attack(corrupt_params=True, **GAMBLER))
    for depth in (0, 2, 4):
        envelope = [b"w1", *[b"made-up-%d" % k for k in range(depth - 1)]][:depth]
        tensor = grad(1, 0) if isinstance(header, Push) else None
        out = core.from_worker(incoming(envelope, header, tensor))
        if depth:
            assert_refused(out, ErrorCode.MALFORMED, envelope=envelope)
        else:
            assert out == []  # nowhere to answer
    assert not core.tables.puller and not core.tables.held
    assert core.counters["malformed"] == 3


def test_params_for_a_pull_with_an_out_of_range_worker_are_relayed() -> None:
    core = make_core(attack(corrupt_params=True, **BITFLIP))
    core.from_worker(incoming(env(1), Pull(round=1, worker=N)))
    reply = params_reply(env(1), 1)
    (out,) = core.from_server(reply)
    assert not out.to_server and as_bytes(out.frames) == as_bytes(reply.frames)


# --------------------------------------------------------------------------- exit


def test_done_after_the_n_acks_of_the_last_round() -> None:
    core = make_core(attack(**GAMBLER))
    last = CFG.rounds - 1
    for worker in range(N):  # the ACKs of an earlier round do not count
        ack = incoming(env(worker), Ack(round=last - 1, worker=worker))
        assert core.from_server(ack, 0.0) == [Outgoing(False, ack.frames)]
    assert not core.done(1e9)
    for worker in range(N):
        assert not core.done(0.0)
        ack = incoming(env(worker), Ack(round=last, worker=worker))
        assert core.from_server(ack, 0.0) == [Outgoing(False, ack.frames)]
    assert core.done(0.0)


def test_one_key_pushing_the_last_round_again_and_again_does_not_end_the_proxy() -> None:
    """The server ACKs each repeat of a counted push: n ACKs of one worker are one
    worker's; and however long the others take after it, the proxy stays while its
    server is there."""
    core = make_core(attack(**GAMBLER))
    last = CFG.rounds - 1
    for _ in range(3 * N):
        core.from_server(incoming(env(1), Ack(round=last, worker=1)), 0.0)
    assert not core.done(0.0)
    assert not core.done(1e6)
    for worker in (0, 2):
        core.from_server(incoming(env(worker), Ack(round=last, worker=worker)), 5.0)
    assert not core.done(1e6)  # n - 1 workers: the last one computes, however long


def test_done_when_the_server_left_in_its_last_round() -> None:
    """A round deadline closed the last round without a worker (its ACK never comes) and
    the server, finished, exited: the proxy leaves SERVER_GONE_S after its connection
    went down; a server that comes back in time (killed and restarted) keeps it."""
    from ps.proxy.core import SERVER_GONE_S

    core = make_core(attack(**GAMBLER))
    core.server_link(False, 0.0)  # gone before the last round: restarted, say
    assert not core.done(SERVER_GONE_S * 10)
    core.server_link(True, 1.0)
    for worker in range(N - 1):
        core.from_server(incoming(env(worker), Ack(round=CFG.rounds - 1, worker=worker)),
                         10.0 + worker)
    core.server_link(False, 20.0)
    assert not core.done(20.0 + SERVER_GONE_S - 0.01)
    core.server_link(True, 25.0)  # back: restarted during the last round
    assert not core.done(20.0 + SERVER_GONE_S)
    core.server_link(False, 30.0)
    core.server_link(False, 35.0)  # (a repeated event does not restart the wait)
    assert core.done(30.0 + SERVER_GONE_S)


def test_a_proxy_started_after_the_last_rounds_acks_leaves_once_the_server_does() -> None:
    """Restarted after every ACK went back, it sees none; the WELCOME's round says the
    run is in its last round."""
    from ps.proxy.core import SERVER_GONE_S

    welcome = replace(WELCOME, round=CFG.rounds - 1)
    core = make_core(attack(**GAMBLER), welcome=welcome)
    core.server_link(False, 3.0)
    assert not core.done(3.0 + SERVER_GONE_S - 0.01)
    assert core.done(3.0 + SERVER_GONE_S)
