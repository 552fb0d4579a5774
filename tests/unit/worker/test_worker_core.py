"""The worker's side of the protocol without sockets (``worker/core.py``): replies in,
frames out, a fake clock.

The core is driven with replies encoded and decoded by the real protocol code; what it
sends is decoded back. Two shards: shard 0 holds x[0:5], shard 1 x[5:10].
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from common.errors import ClusterTimeout, ConfigError, PeerError
from common.net.protocol import (
    Ack,
    Error,
    ErrorCode,
    Header,
    Hello,
    Message,
    Params,
    ProtocolError,
    Pull,
    Push,
    Welcome,
    decode,
    encode,
)
from common.run.config import RunConfig
from worker.core import (
    HANDSHAKE_GRACE_S,
    MAX_RESENDS,
    ClientCore,
    Connection,
    NextRound,
    RetryPolicy,
    Send,
    ServerRefused,
)

CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rule="mean", q=0,
                rounds=6).validate()
ENDPOINTS = ["tcp://s0:1", "tcp://s1:1"]
RANGES = [(0, 5), (5, 10)]  # shard_ranges(D, 2)
D = 10
TIMEOUT = 10.0
RETRIES = 2
WORKER = 1

# --------------------------------------------------------------------------- helpers


def welcome(shard: int, round_: int = 0) -> Welcome:
    start, stop = RANGES[shard]
    return Welcome(shards=[shard], num_shards=2, d=D, length=stop - start, round=round_,
                   rounds=CFG.rounds)


def reply(header: Header, tensor: np.ndarray | None = None) -> Message:
    """A reply as the link hands it to the core."""
    return decode(encode(header, tensor))


def x_of(round_: int) -> np.ndarray:
    """The parameters the servers hold at ``round_`` (made up, distinct per round)."""
    return np.arange(D, dtype=np.float32) + np.float32(100 * round_)


def params(shard: int, round_: int) -> Message:
    start, stop = RANGES[shard]
    return reply(Params(round=round_, shards=[shard], length=stop - start),
                 x_of(round_)[start:stop])


def bare(shard: int, round_: int, **changes: object) -> Message:
    """A bare PARAMS(round_) of ``shard`` (``changes``: to its header's fields)."""
    start, stop = RANGES[shard]
    fields = {"round": round_, "shards": [shard], "length": stop - start, **changes}
    return reply(Params(**fields, bare=True))  # type: ignore[arg-type]


def error(code: ErrorCode, round_: int = 0) -> Message:
    return reply(Error(code=code.value, message="no", round=round_))


def gradient(round_: int) -> np.ndarray:
    return np.full(D, round_ + 0.5, dtype=np.float32)


def sent(sends: list[Send]) -> list[tuple[int, bool, Header]]:
    """(shard, on a new connection, header) of each message the core sends."""
    return [(s.link, s.reopen, decode(s.frames).header) for s in sends]


def pushed(send: Send) -> tuple[Push, np.ndarray]:
    msg = decode(send.frames)
    return msg.header, np.array(msg.tensor())  # type: ignore[return-value]


def make_core(replay_rounds: int = 4) -> ClientCore:
    """A worker's core after its HELLO exchange (the shard ranges known)."""
    core = ClientCore(CFG, "worker", WORKER, ENDPOINTS, RetryPolicy(TIMEOUT, RETRIES),
                      replay_rounds)
    core.hello(0.0)
    for s in (0, 1):
        core.handle(s, reply(welcome(s)), 0.0)
    assert not core.pending
    return core


def until_given_up(core: ClientCore, server: int, answer: Message | ProtocolError,
                   now: float) -> None:
    """Deliver ``answer``, a reply the request cannot use, as often as the policy lets the
    request be resent: each time it is counted and one attempt is spent on a new
    connection (the resent request first); the last one raises."""
    for attempt in range(RETRIES):
        sends = core.handle(server, answer, now)
        assert sends and sends[0].reopen and sends[0].link == server, sends
        assert sum(core.bad_replies.values()) == attempt + 1
    core.handle(server, answer, now)


HELLO = Hello(role="worker", worker=WORKER, config_hash=CFG.config_hash,
              config=CFG.to_dict())


def hello_again(shard: int) -> tuple[int, bool, Header]:
    """A HELLO on a new connection."""
    return (shard, True, HELLO)


# --------------------------------------------------------------------------- exchanges


def test_hello_learns_the_shard_ranges_and_d() -> None:
    core = ClientCore(CFG, "worker", WORKER, ENDPOINTS)
    assert sent(core.hello(0.0)) == [(0, False, HELLO), (1, False, HELLO)]
    core.handle(1, reply(welcome(1)), 0.0)
    assert core.pending == {0}
    core.handle(0, reply(welcome(0, round_=2)), 0.0)
    assert not core.pending
    assert [w.round for w in core.outcome] == [2, 0]  # type: ignore[attr-defined]
    assert [link.slices.ranges for link in core.links] == [(r,) for r in RANGES]
    assert core.d == D


def test_endpoints_in_the_wrong_order_are_a_configuration_error() -> None:
    core = ClientCore(CFG, "worker", WORKER, ENDPOINTS)
    core.hello(0.0)
    core.handle(0, reply(welcome(1)), 0.0)
    with pytest.raises(ConfigError, match="check the endpoint order"):
        core.handle(1, reply(welcome(0)), 0.0)


def test_a_wrong_number_of_endpoints_is_refused() -> None:
    with pytest.raises(ConfigError, match="3 server endpoints given for S=2"):
        ClientCore(CFG, "worker", WORKER, [*ENDPOINTS, "tcp://s2:1"])


def test_pull_assembles_x_from_the_shards() -> None:
    core = make_core()
    assert sent(core.pull(3, 1.0)) == [(0, False, Pull(round=3, worker=WORKER)),
                                       (1, False, Pull(round=3, worker=WORKER))]
    core.handle(0, params(0, 3), 1.0)
    core.handle(1, params(1, 3), 1.0)
    np.testing.assert_array_equal(core.outcome, x_of(3))  # type: ignore[arg-type]


def test_params_of_another_round_are_a_peer_error() -> None:
    core = make_core()
    core.pull(3, 1.0)
    with pytest.raises(PeerError, match="s1:1 sent round 4 of shards 1 with 5 values, "
                       "expected round 3 of shards 1"):
        until_given_up(core, 1, params(1, 4), 1.0)


def test_push_sends_each_shard_its_slice_and_returns_the_next_round() -> None:
    core = make_core()
    sends = core.push(2, gradient(2), 1.0)
    for s, send in enumerate(sends):
        header, values = pushed(send)
        assert header == Push(round=2, worker=WORKER, length=RANGES[s][1] - RANGES[s][0],
                              pull_next=True)
        np.testing.assert_array_equal(values, gradient(2)[slice(*RANGES[s])])
    core.handle(0, params(0, 3), 1.5)
    core.handle(1, params(1, 3), 1.5)
    outcome = core.outcome
    assert isinstance(outcome, NextRound) and (outcome.round, outcome.missed) == (3, False)
    np.testing.assert_array_equal(outcome.params, x_of(3))


def test_the_last_round_is_acked_and_ends_the_run() -> None:
    core = make_core()
    last = CFG.rounds - 1
    sends = core.push(last, gradient(last), 1.0)
    assert not pushed(sends[0])[0].pull_next
    for s in (0, 1):
        core.handle(s, reply(Ack(round=last, worker=WORKER)), 1.0)
    assert core.outcome == NextRound(CFG.rounds, None)


def test_a_reply_of_the_wrong_kind_is_a_peer_error() -> None:
    core = make_core()
    core.pull(1, 1.0)
    with pytest.raises(PeerError, match="expected Params, got Ack"):
        until_given_up(core, 0, reply(Ack(round=1, worker=WORKER)), 1.0)


def test_a_malformed_reply_is_a_peer_error_naming_the_endpoint() -> None:
    core = make_core()
    core.pull(1, 1.0)
    with pytest.raises(PeerError, match="tcp://s1:1 sent a malformed reply: bad"):
        until_given_up(core, 1, ProtocolError("bad"), 1.0)


# --------------------------------------------------------------------------- bare PARAMS


def test_a_bare_params_push_asks_every_server_for_a_bare_reply() -> None:
    core = make_core()
    sends = core.push(2, gradient(2), 1.0, bare_params=True)
    assert [pushed(send)[0] for send in sends] == [
        Push(round=2, worker=WORKER, length=5, pull_next=True, bare_params=True)] * 2


def test_a_push_asks_for_the_values_by_default() -> None:
    core = make_core()
    assert not any(pushed(send)[0].bare_params for send in core.push(2, gradient(2), 1.0))


def test_the_last_round_push_never_asks_for_bare_params() -> None:
    core = make_core()
    last = CFG.rounds - 1
    sends = core.push(last, gradient(last), 1.0, bare_params=True)
    assert [pushed(send)[0] for send in sends] == [
        Push(round=last, worker=WORKER, length=5)] * 2
    for s in (0, 1):
        core.handle(s, reply(Ack(round=last, worker=WORKER)), 1.0)
    assert core.outcome == NextRound(CFG.rounds, None)


def test_bare_replies_to_a_bare_push_leave_their_links_owed() -> None:
    core = make_core()
    core.push(2, gradient(2), 1.0, bare_params=True)
    core.handle(1, bare(1, 3), 1.5)
    core.handle(0, params(0, 3), 1.5)
    outcome = core.outcome
    assert isinstance(outcome, NextRound)
    assert (outcome.round, outcome.missed, outcome.owed) == (3, False, (1,))
    np.testing.assert_array_equal(outcome.params[:5], x_of(3)[:5])  # type: ignore[index]


def test_all_bare_replies_owe_every_link_in_order() -> None:
    core = make_core()
    core.push(2, gradient(2), 1.0, bare_params=True)
    core.handle(1, bare(1, 3), 1.5)
    core.handle(0, bare(0, 3), 1.5)
    assert core.outcome.owed == (0, 1)  # type: ignore[attr-defined]


def test_full_replies_to_a_bare_push_owe_nothing() -> None:
    core = make_core()
    core.push(2, gradient(2), 1.0, bare_params=True)
    core.handle(0, params(0, 3), 1.5)
    core.handle(1, params(1, 3), 1.5)
    outcome = core.outcome
    assert isinstance(outcome, NextRound) and (outcome.round, outcome.owed) == (3, ())
    np.testing.assert_array_equal(outcome.params, x_of(3))


@pytest.mark.parametrize(("changes", "what"), [
    ({"round": 4}, "sent round 4 of shards 1 with 5 values"),
    ({"length": 4}, "sent round 3 of shards 1 with 4 values"),
    ({"shards": [0]}, "sent round 3 of shards 0 with 5 values"),
], ids=["round", "length", "shards"])
def test_a_bare_reply_is_checked_like_a_full_one(changes: dict, what: str) -> None:
    core = make_core()
    core.push(2, gradient(2), 1.0, bare_params=True)
    with pytest.raises(PeerError, match=what):
        until_given_up(core, 1, bare(1, 3, **changes), 1.5)


def test_a_bare_reply_to_a_push_that_did_not_ask_is_a_peer_error() -> None:
    core = make_core()
    core.push(2, gradient(2), 1.0)
    with pytest.raises(PeerError, match="s1:1 sent a bare PARAMS of round 3, which this "
                       "worker did not ask for"):
        until_given_up(core, 1, bare(1, 3), 1.5)


@pytest.mark.parametrize("start", ["pull", "catch_up"])
def test_a_bare_reply_to_a_pull_is_a_peer_error(start: str) -> None:
    core = make_core()
    getattr(core, start)(3, 1.0)
    with pytest.raises(PeerError, match="did not ask for"):
        until_given_up(core, 0, bare(0, 3), 1.5)


def test_a_resent_bare_push_counted_already_pulls_the_values() -> None:
    """Its reply was lost: the PULL that follows asks for the values, and a bare
    answer to it is a peer error."""
    core = make_core()
    core.push(2, gradient(2), 0.0, bare_params=True)
    core.handle(1, bare(1, 3), 1.0)
    core.tick(TIMEOUT)  # shard 0 resent
    assert sent(core.handle(0, error(ErrorCode.DUPLICATE, 2), TIMEOUT + 1)) == [
        (0, False, Pull(round=3, worker=WORKER))]
    core.handle(0, params(0, 3), TIMEOUT + 2)
    assert core.outcome.owed == (1,)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(core.outcome.params[:5], x_of(3)[:5])  # type: ignore[attr-defined]
    again = make_core()
    again.push(2, gradient(2), 0.0, bare_params=True)
    again.tick(TIMEOUT)
    again.handle(0, error(ErrorCode.DUPLICATE, 2), TIMEOUT + 1)
    assert again.handle(0, bare(0, 3), TIMEOUT + 2)  # not what it asked for: asked again
    assert again.bad_replies == {"unusable": 1}


def test_a_bare_push_that_catches_up_owes_nothing() -> None:
    core = make_core()
    core.push(2, gradient(2), 0.0, bare_params=True)
    core.handle(0, bare(0, 3), 1.0)
    sends = core.handle(1, error(ErrorCode.STALE_ROUND, 4), 1.0)
    assert [h for _, _, h in sent(sends)] == [Pull(round=4, worker=WORKER)] * 2
    core.handle(0, params(0, 4), 2.0)
    core.handle(1, params(1, 4), 2.0)
    outcome = core.outcome
    assert isinstance(outcome, NextRound)
    assert (outcome.round, outcome.missed, outcome.owed) == (4, True, ())
    np.testing.assert_array_equal(outcome.params, x_of(4))


def owing(round_: int, owed: tuple[int, ...], missed: bool = False) -> NextRound:
    """Where a worker stands after bare replies from ``owed``: the other links' spans of
    x^round_ filled, the owed ones holding garbage."""
    x = np.full(D, np.nan, dtype=np.float32)
    for s in set(range(len(RANGES))) - set(owed):
        x[slice(*RANGES[s])] = x_of(round_)[slice(*RANGES[s])]
    return NextRound(round_, x, missed, owed)


def test_borrow_copies_only_the_owed_spans() -> None:
    core = make_core()
    at = owing(3, (1,), missed=True)
    lent = x_of(3).copy()
    lent[:5] = -1.0  # not the owed span: left alone
    done = core.borrow(at, lent)
    assert (done.round, done.missed, done.owed) == (3, True, ())
    np.testing.assert_array_equal(done.params, x_of(3))


def test_borrow_of_every_link_takes_the_lenders_vector_itself() -> None:
    core = make_core()
    lent = x_of(3)
    done = core.borrow(owing(3, (0, 1)), lent)
    assert done.owed == () and done.params is lent  # nothing copied: never modified


def test_pull_owed_pulls_only_the_owed_links_and_completes_the_round() -> None:
    core = make_core()
    at = owing(3, (1,))
    assert sent(core.pull_owed(at, 1.0)) == [(1, False, Pull(round=3, worker=WORKER))]
    assert core.pending == {1}
    core.handle(1, params(1, 3), 1.5)
    outcome = core.outcome
    assert isinstance(outcome, NextRound)
    assert (outcome.round, outcome.missed, outcome.owed) == (3, False, ())
    np.testing.assert_array_equal(outcome.params, x_of(3))


def _owing_after_a_bare_push(core: ClientCore) -> NextRound:
    """Round 2 pushed asking for bare PARAMS: link 0 sent the values, link 1 a bare one."""
    core.push(2, gradient(2), 0.5, bare_params=True)
    core.handle(0, params(0, 3), 0.6)
    core.handle(1, bare(1, 3), 0.6)
    at = core.outcome
    assert isinstance(at, NextRound) and at.owed == (1,)
    return at


def test_pull_owed_pushes_the_kept_round_again_asking_for_the_values() -> None:
    core = make_core()
    at = _owing_after_a_bare_push(core)
    [send] = core.pull_owed(at, 1.0)
    header, values = pushed(send)
    assert send.link == 1 and not send.reopen
    assert header == Push(round=2, worker=WORKER, length=5, pull_next=True)  # not bare
    np.testing.assert_array_equal(values, gradient(2)[5:])
    core.handle(1, params(1, 3), 1.5)  # the server answers it as the push it counted
    outcome = core.outcome
    assert isinstance(outcome, NextRound) and (outcome.round, outcome.owed) == (3, ())
    np.testing.assert_array_equal(outcome.params, x_of(3))


def test_pull_owed_from_a_server_restarted_behind_replays_what_it_lost() -> None:
    """The server restarted from an older checkpoint: the rounds it lacks are pushed
    again (as every worker of the run does), then the round before the owed one."""
    core = make_core()
    core.sent.record(1, gradient(1))
    at = _owing_after_a_bare_push(core)
    core.pull_owed(at, 1.0)
    [replay] = core.handle(1, error(ErrorCode.WRONG_ROUND, 1), 1.5)  # resumed at round 1
    assert pushed(replay)[0] == Push(round=1, worker=WORKER, length=5, pull_next=True)
    [again] = core.handle(1, params(1, 2), 2.0)
    assert pushed(again)[0] == Push(round=2, worker=WORKER, length=5, pull_next=True)
    core.handle(1, params(1, 3), 2.5)
    np.testing.assert_array_equal(core.outcome.params, x_of(3))  # type: ignore[attr-defined]


def test_pull_owed_refused_as_stale_catches_up_where_the_server_is() -> None:
    core = make_core()
    core.pull_owed(owing(3, (1,)), 1.0)
    sends = core.handle(1, error(ErrorCode.STALE_ROUND, 5), 1.5)
    assert sent(sends) == [(0, False, Pull(round=5, worker=WORKER)),
                           (1, False, Pull(round=5, worker=WORKER))]
    core.handle(0, params(0, 5), 2.0)
    core.handle(1, params(1, 5), 2.0)
    outcome = core.outcome
    assert isinstance(outcome, NextRound)
    assert (outcome.round, outcome.missed, outcome.owed) == (5, True, ())
    np.testing.assert_array_equal(outcome.params, x_of(5))


def test_pull_owed_refused_as_stale_at_its_own_round_is_a_bad_reply() -> None:
    """No honest server says a round is stale at that very round: counted, retried."""
    core = make_core()
    core.pull_owed(owing(3, (0, 1)), 1.0)
    with pytest.raises(PeerError, match=r"says round 3 is stale at round 3, not one of 4\.\.6"):
        until_given_up(core, 0, error(ErrorCode.STALE_ROUND, 3), 1.5)
    assert core.bad_replies == {"stale-round": RETRIES + 1}


# --------------------------------------------------------------------------- timeouts


def test_a_request_is_resent_on_a_new_connection_after_its_timeout() -> None:
    core = make_core()
    core.pull(1, 0.0)
    core.handle(0, params(0, 1), 1.0)
    assert core.tick(TIMEOUT - 0.1) == []
    assert sent(core.tick(TIMEOUT)) == [hello_again(1), (1, False, Pull(round=1, worker=WORKER))]
    assert core.tick(TIMEOUT + 1) == []  # the next attempt has its own timeout
    # the WELCOME to the new connection's HELLO is skipped; PARAMS answer the PULL
    assert core.handle(1, reply(welcome(1)), TIMEOUT + 2) == []
    assert core.pending == {1}
    core.handle(1, params(1, 1), TIMEOUT + 2)
    np.testing.assert_array_equal(core.outcome, x_of(1))  # type: ignore[arg-type]


def test_after_its_retries_a_request_gives_up_naming_the_silent_server() -> None:
    core = make_core()
    core.pull(1, 0.0)
    core.handle(1, params(1, 1), 1.0)
    now = 0.0
    for _ in range(RETRIES):
        now += TIMEOUT
        assert sent(core.tick(now))[0] == hello_again(0)
    with pytest.raises(ClusterTimeout, match=r"no reply from tcp://s0:1 after 3 attempts of 10 s"):
        core.tick(now + TIMEOUT)


def test_a_resent_push_refused_as_a_repeat_counted_and_pulls_the_next_round() -> None:
    """The server counted the first push; its reply was lost: PULL the next round. When
    that PULL is resent, the push goes first, once: the server may have lost it."""
    core = make_core()
    core.push(2, gradient(2), 0.0)
    core.handle(1, params(1, 3), 1.0)
    core.tick(TIMEOUT)  # shard 0 resent
    assert sent(core.handle(0, error(ErrorCode.DUPLICATE, 2), TIMEOUT + 1)) == [
        (0, False, Pull(round=3, worker=WORKER))]
    resend = core.tick(2 * TIMEOUT + 1)
    assert sent(resend)[0] == hello_again(0)
    header, values = pushed(resend[1])
    assert header == Push(round=2, worker=WORKER, length=5)
    np.testing.assert_array_equal(values, gradient(2)[:5])
    assert len(resend) == 2  # the PULL waits for the re-push's answer
    # any answer to the re-push will do, then the PULL
    assert sent(core.handle(0, error(ErrorCode.STALE_ROUND, 3), 2 * TIMEOUT + 2)) == [
        (0, False, Pull(round=3, worker=WORKER))]
    core.handle(0, params(0, 3), 2 * TIMEOUT + 3)
    assert core.outcome.round == 3  # type: ignore[attr-defined]
    np.testing.assert_array_equal(core.outcome.params, x_of(3))  # type: ignore[attr-defined]


def test_a_re_push_nobody_answers_is_left_behind_on_a_new_connection() -> None:
    core = make_core()
    core.push(2, gradient(2), 0.0)
    core.handle(1, params(1, 3), 0.0)
    core.tick(TIMEOUT)
    core.handle(0, error(ErrorCode.DUPLICATE, 2), TIMEOUT)
    core.tick(2 * TIMEOUT)  # the PULL resent: the re-push first
    assert sent(core.tick(3 * TIMEOUT)) == [hello_again(0),
                                            (0, False, Pull(round=3, worker=WORKER))]


def test_a_repeat_refusal_of_a_push_sent_once_costs_an_attempt() -> None:
    """A Byzantine server (or a proxy) may say ``duplicate`` to a first push: resent on
    a new connection; a resent push answered so was counted the first time."""
    core = make_core()
    core.push(2, gradient(2), 0.0)
    sends = core.handle(0, error(ErrorCode.DUPLICATE, 2), 1.0)
    assert sends[0].reopen and core.bad_replies == {"duplicate": 1}
    # counted the first time: its reply was lost, so the next round's values are pulled
    assert sent(core.handle(0, error(ErrorCode.DUPLICATE, 2), 1.0)) == [
        (0, False, Pull(round=3, worker=WORKER))]


# --------------------------------------------------------------------------- dropped connections


def test_a_request_whose_connection_dropped_is_resent_at_once_and_only_once() -> None:
    core = make_core()
    core.push(2, gradient(2), 0.0)
    core.connection(0, [Connection.SUCCEEDED, Connection.DISCONNECTED], 1.0)
    resend = core.tick(1.0)
    assert sent(resend)[0] == hello_again(0)
    assert pushed(resend[1])[0].round == 2
    # it drops again within the same attempt: left to the timeout, not a storm
    core.connection(0, [Connection.SUCCEEDED, Connection.DISCONNECTED], 2.0)
    assert core.tick(2.0) == []
    assert sent(core.tick(1.0 + TIMEOUT))[0] == hello_again(0)


def test_a_push_resent_after_a_drop_and_refused_as_a_repeat_counted() -> None:
    core = make_core()
    core.push(2, gradient(2), 0.0)
    core.connection(0, [Connection.SUCCEEDED, Connection.DISCONNECTED], 1.0)
    core.tick(1.0)
    assert sent(core.handle(0, error(ErrorCode.DUPLICATE, 2), 2.0)) == [
        (0, False, Pull(round=3, worker=WORKER))]


def test_a_connection_lost_before_the_request_is_not_a_reason_to_resend() -> None:
    core = make_core()
    core.connection(0, [Connection.SUCCEEDED, Connection.DISCONNECTED], 0.0)
    core.pull(1, 1.0)
    assert core.tick(2.0) == []


def test_a_connection_that_never_got_through_did_not_drop_a_request() -> None:
    core = make_core()
    core.pull(1, 1.0)
    core.connection(0, [Connection.DISCONNECTED], 2.0)
    assert core.tick(2.0) == []


# --------------------------------------------------------------------------- refusals


def test_hello_first_says_hello_again_and_repeats_the_request() -> None:
    core = make_core()
    core.pull(1, 0.0)
    core.handle(1, params(1, 1), 0.0)
    for i in range(MAX_RESENDS):
        now = 5.0 * (i + 1)
        assert sent(core.handle(0, error(ErrorCode.HELLO_FIRST), now)) == [
            (0, False, HELLO), (0, False, Pull(round=1, worker=WORKER))]
        assert core.next_deadline() == now + TIMEOUT  # the request's timeout starts again
    answered = MAX_RESENDS
    with pytest.raises(ServerRefused, match="hello-first"):
        for _ in range(100):
            answered += 1
            core.handle(0, error(ErrorCode.HELLO_FIRST), 20.0)
    # each attempt says HELLO again MAX_RESENDS times; the last refusal of each costs it
    assert answered == (MAX_RESENDS + 1) * (RETRIES + 1)


def test_the_welcomes_to_hellos_said_again_are_skipped() -> None:
    core = make_core()
    core.pull(1, 0.0)
    core.handle(0, error(ErrorCode.HELLO_FIRST), 1.0)
    assert core.handle(0, reply(welcome(0)), 1.0) == []
    sends = core.handle(0, reply(welcome(0)), 1.0)  # not one more: unusable, asked again
    assert sends[0].reopen and core.bad_replies == {"unusable": 1}


def test_a_server_behind_the_worker_gets_the_rounds_it_lacks_replayed() -> None:
    core = make_core()
    for t in range(4):
        core.sent.record(t, gradient(t))
    core.push(4, gradient(4), 0.0)
    core.handle(1, params(1, 5), 0.0)
    replay = core.handle(0, error(ErrorCode.WRONG_ROUND, 2), 1.0)  # resumed at round 2
    for t in (2, 3):
        header, values = pushed(replay[0])
        assert header == Push(round=t, worker=WORKER, length=5, pull_next=True)
        np.testing.assert_array_equal(values, gradient(t)[:5])
        replay = core.handle(0, params(0, t + 1), 1.0 + t)
    header, values = pushed(replay[0])  # then the push of the current round again
    assert header == Push(round=4, worker=WORKER, length=5, pull_next=True)
    np.testing.assert_array_equal(values, gradient(4)[:5])
    core.handle(0, params(0, 5), 5.0)
    np.testing.assert_array_equal(core.outcome.params, x_of(5))  # type: ignore[attr-defined]


def test_a_replayed_round_times_out_on_its_own() -> None:
    core = make_core()
    core.sent.record(1, gradient(1))
    core.push(2, gradient(2), 0.0)
    core.handle(0, error(ErrorCode.WRONG_ROUND, 1), 1.0)
    resend = core.tick(1.0 + TIMEOUT)
    assert sent(resend)[0] == hello_again(0)
    assert pushed(resend[1])[0].round == 1


def test_a_server_behind_the_kept_rounds_is_a_peer_error() -> None:
    core = make_core(replay_rounds=2)
    for t in range(5):
        core.sent.record(t, gradient(t))
    core.push(5, gradient(5), 0.0)
    with pytest.raises(PeerError, match="keeps only its last 2 rounds"):
        core.handle(0, error(ErrorCode.WRONG_ROUND, 2), 1.0)


def test_wrong_round_ahead_of_the_worker_is_a_refusal() -> None:
    core = make_core()
    core.push(2, gradient(2), 0.0)
    with pytest.raises(ServerRefused, match="wrong-round"):
        until_given_up(core, 0, error(ErrorCode.WRONG_ROUND, 3), 1.0)


def test_a_configuration_mismatch_is_a_configuration_error() -> None:
    core = ClientCore(CFG, "worker", WORKER, ENDPOINTS, RetryPolicy(TIMEOUT, RETRIES))
    core.hello(0.0)
    with pytest.raises(ConfigError, match="tcp://s0:1 refused: no"):
        until_given_up(core, 0, error(ErrorCode.CONFIG_MISMATCH), 0.0)


# --------------------------------------------------------------------------- catching up


def test_a_push_after_its_round_closed_catches_up() -> None:
    """Shard 0 closed round 2 without this worker and is at round 4: every shard is
    pulled at round 4; shard 1, still waiting, gets a new connection first."""
    core = make_core()
    core.push(2, gradient(2), 0.0)
    sends = core.handle(0, error(ErrorCode.STALE_ROUND, 4), 1.0)
    assert sent(sends) == [hello_again(1), (0, False, Pull(round=4, worker=WORKER)),
                           (1, False, Pull(round=4, worker=WORKER))]
    core.handle(0, params(0, 4), 2.0)
    core.handle(1, params(1, 4), 2.0)
    outcome = core.outcome
    assert isinstance(outcome, NextRound) and (outcome.round, outcome.missed) == (4, True)
    np.testing.assert_array_equal(outcome.params, x_of(4))


def test_catching_up_moves_on_past_rounds_no_longer_served() -> None:
    core = make_core()
    core.catch_up(1, 0.0)
    core.handle(1, params(1, 1), 0.0)
    sends = core.handle(0, error(ErrorCode.STALE_ROUND, 3), 1.0)
    assert [h for _, _, h in sent(sends)] == [Pull(round=3, worker=WORKER)] * 2
    core.handle(0, params(0, 3), 2.0)
    core.handle(1, params(1, 3), 2.0)
    assert core.outcome.round == 3 and not core.outcome.missed  # type: ignore[attr-defined]


def test_catching_up_refused_at_an_older_round_is_a_bad_reply() -> None:
    core = make_core()
    core.catch_up(3, 0.0)
    with pytest.raises(PeerError, match="says round 3 is stale at round 3"):
        until_given_up(core, 0, error(ErrorCode.STALE_ROUND, 3), 1.0)
    assert core.bad_replies == {"stale-round": RETRIES + 1}


@pytest.mark.parametrize("stale_at", [-1, 2, 3, CFG.rounds + 1, 10**9])
def test_a_push_refused_as_stale_at_a_round_no_server_is_at_is_a_bad_reply(
        stale_at: int) -> None:
    """A hostile server (or a proxy fronting one) answering the push of round 3 with
    ``stale-round`` at a round not in 4..rounds: before, the worker caught up there (an
    older round recomputed, momentum and all; a negative one raised deep in seeding;
    one past the run ended the worker quietly, exit 0). Now it costs an attempt."""
    core = make_core()
    core.push(3, gradient(3), 0.0)
    sends = sent(core.handle(0, error(ErrorCode.STALE_ROUND, stale_at), 1.0))
    assert [(link, reopen, type(h)) for link, reopen, h in sends] == [
        (0, True, Hello), (0, False, Push)]  # the push again, on a new connection
    assert core.bad_replies == {"stale-round": 1}
    assert core.outcome is None and core.pending == {0, 1}  # no catching up, not done


def test_an_ack_of_another_round_or_worker_is_a_bad_reply() -> None:
    core = make_core()
    last = CFG.rounds - 1
    core.push(last, gradient(last), 0.0)
    core.handle(1, reply(Ack(round=last, worker=WORKER)), 0.5)
    with pytest.raises(PeerError, match=f"acknowledged round 12345 of worker 7, not round "
                                        f"{last} of worker {WORKER}"):
        until_given_up(core, 0, reply(Ack(round=12345, worker=7)), 1.0)


@pytest.mark.parametrize("changes", [{"d": 1}, {"d": 0}, {"round": -7},
                                     {"round": CFG.rounds + 1}])
def test_a_welcome_no_server_of_the_run_sends_is_refused(changes: dict) -> None:
    core = ClientCore(CFG, "worker", WORKER, ENDPOINTS, RetryPolicy(TIMEOUT, RETRIES))
    core.hello(0.0)
    core.handle(1, reply(welcome(1)), 0.0)
    with pytest.raises(PeerError, match="no server of 2 shards and 6 rounds does"):
        core.handle(0, reply(replace(welcome(0), **changes)), 0.0)


def test_a_reader_refused_stale_round_is_told() -> None:
    """An evaluator's pull does not catch up by itself: it picks its next round."""
    core = make_core()
    core.pull(1, 0.0)
    with pytest.raises(ServerRefused) as raised:
        until_given_up(core, 0, error(ErrorCode.STALE_ROUND, 3), 1.0)
    assert (raised.value.code, raised.value.round) == (ErrorCode.STALE_ROUND.value, 3)


def test_the_last_round_closed_without_the_worker_finishes_it() -> None:
    core = make_core()
    last = CFG.rounds - 1
    core.push(last, gradient(last), 0.0)
    sends = core.handle(1, error(ErrorCode.STALE_ROUND, CFG.rounds), 1.0)
    assert sent(sends) == [hello_again(0)]  # shard 0's reply is not waited for
    assert not core.pending
    assert core.outcome == NextRound(CFG.rounds, None, missed=True)


def test_abandoning_an_exchange_reconnects_the_shards_still_waiting() -> None:
    core = make_core()
    core.pull(1, 0.0)
    core.handle(0, params(0, 1), 0.0)
    assert sent(core.abandon()) == [hello_again(1)]
    assert not core.pending


# --------------------------------------------------------------------------- handshakes


def test_a_refused_handshake_ends_the_client_at_once() -> None:
    """An impostor's key, or one the server does not admit: no retry."""
    core = make_core()
    core.pull(1, 0.0)
    with pytest.raises(PeerError, match="security handshake with tcp://s1:1 failed: "):
        core.connection(1, [Connection.REFUSED], 1.0)


def test_connections_closed_during_the_handshake_are_ridden_out_for_the_grace() -> None:
    """A relay whose server restarts closes connections the way an impostor does: only
    ``HANDSHAKE_GRACE_S`` without a successful handshake ends the client."""
    core = ClientCore(CFG, "worker", WORKER, ENDPOINTS, RetryPolicy(100.0, RETRIES))
    core.hello(0.0)
    core.connection(0, [Connection.CLOSED], 1.0)
    core.connection(0, [Connection.CLOSED], 1.0 + HANDSHAKE_GRACE_S - 0.1)
    assert core.tick(1.0 + HANDSHAKE_GRACE_S - 0.1) == []
    core.connection(0, [Connection.SUCCEEDED], 2.0 + HANDSHAKE_GRACE_S)  # the server is back
    core.connection(0, [Connection.CLOSED], 3.0 + HANDSHAKE_GRACE_S)
    assert core.tick(2.0 + 2 * HANDSHAKE_GRACE_S) == []
    with pytest.raises(PeerError, match=r"closed every connection during the handshake for 15 s"):
        core.tick(3.0 + 2 * HANDSHAKE_GRACE_S)


def test_a_request_that_gives_up_while_handshakes_fail_names_the_handshake() -> None:
    core = make_core()
    core.pull(1, 0.0)
    core.handle(1, params(1, 1), 0.0)
    core.connection(0, [Connection.CLOSED], 1.0)
    now = 0.0
    for _ in range(RETRIES):
        now += TIMEOUT
        core.tick(now)
        core.connection(0, [Connection.SUCCEEDED, Connection.CLOSED], now)  # grace again
    with pytest.raises(PeerError, match="security handshake with tcp://s0:1 failed"):
        core.tick(now + TIMEOUT)


@pytest.mark.parametrize("bad", [ProtocolError("garbage"), reply(Ack(round=1, worker=WORKER)),
                                 error(ErrorCode.INTERNAL), error(ErrorCode.BUSY)],
                         ids=["malformed", "wrong-kind", "internal", "busy"])
def test_an_unusable_reply_costs_one_attempt_and_the_run_goes_on(bad) -> None:
    """Issue 35: a Byzantine server or proxy may answer with garbage or an ERROR when it
    likes; the worker counts it, resends on a new connection, and goes on."""
    core = make_core()
    core.pull(1, 1.0)
    core.handle(1, params(1, 1), 1.0)
    sends = core.handle(0, bad, 1.0)
    assert sends[0].reopen and sent(sends)[-1] == (0, False, Pull(round=1, worker=WORKER))
    assert sum(core.bad_replies.values()) == 1
    core.handle(0, params(0, 1), 1.5)
    np.testing.assert_array_equal(core.outcome, x_of(1))  # the pull's outcome: x^1
