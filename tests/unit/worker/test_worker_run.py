"""A worker's round as a state machine (``worker/round.py``), driven with a fake clock:
its phases, and how a worker whose PARAMS came bare settles (borrows the lender's x,
pulls, or waits), without sockets.

Each member has a real ``ClientCore`` behind a stand-in client that starts an exchange
at once and keeps what it sent. Two shards: shard 0 holds x[0:5], shard 1 x[5:10].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from common.net.protocol import Ack, Error, ErrorCode, Params, Pull, Push, Welcome, decode, encode
from common.run.config import RunConfig
from common.run.metrics import JsonlWriter, read_jsonl
from worker.core import ClientCore, NextRound, Send
from worker.round import Phase, WorkerRound

CFG = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rule="mean", q=0,
                rounds=6).validate()
ENDPOINTS = ["tcp://s0:1", "tcp://s1:1"]
RANGES = [(0, 5), (5, 10)]
D = 10
WORKER = 1
GRACE_S = 10.0  # how long a member waits for its lender


def x_of(round_: int) -> np.ndarray:
    """The parameters the servers hold at ``round_`` (made up, distinct per round)."""
    return np.arange(D, dtype=np.float32) + np.float32(100 * round_)


class FakeClient:
    """The part of ``ClusterClient`` a member uses: its core, and ``begin``."""

    def __init__(self) -> None:
        self.core = ClientCore(CFG, "worker", WORKER, ENDPOINTS)
        self.core.hello(0.0)
        for s, (start, stop) in enumerate(RANGES):
            welcome = Welcome(shards=[s], num_shards=2, d=D, length=stop - start, round=0,
                              rounds=CFG.rounds)
            self.core.handle(s, decode(encode(welcome)), 0.0)
        assert not self.core.pending
        self.sends: list[list[Send]] = []  # what each exchange begun sent first

    def begin(self, start: Callable[[float], list[Send]]) -> None:
        self.sends.append(start(1.0))

    def headers(self) -> list[tuple[int, object]]:
        """(link, header) of what the one exchange begun sent."""
        [sends] = self.sends
        return [(s.link, decode(s.frames).header) for s in sends]


class Step:
    """A worker's step: records the rounds it computed."""

    def __init__(self) -> None:
        self.rounds: list[int] = []

    def __call__(self, x: np.ndarray, round_: int) -> tuple[np.ndarray, float]:
        self.rounds.append(round_)
        return np.full(D, round_ + 0.5, dtype=np.float32), 1.0


def member(at: NextRound | None, bare: bool = True) -> WorkerRound:
    return WorkerRound(WORKER, Step(), FakeClient(), JsonlWriter(None),  # type: ignore[arg-type]
                   at=at, bare=bare)


def owing(round_: int, owed: tuple[int, ...] = (1,)) -> NextRound:
    """After bare replies from ``owed``: the other links' spans of x^round_ filled."""
    x = np.full(D, np.nan, dtype=np.float32)
    for s in set(range(len(RANGES))) - set(owed):
        x[slice(*RANGES[s])] = x_of(round_)[slice(*RANGES[s])]
    return NextRound(round_, x, owed=owed)


def test_a_member_owing_nothing_does_not_settle() -> None:
    at = NextRound(3, x_of(3))
    m = member(at)
    m.settle((NextRound(4, x_of(4)),), 0.0, GRACE_S)
    assert m.at is at and m.client.sends == []  # type: ignore[attr-defined]


def test_a_member_whose_push_is_under_way_does_not_settle() -> None:
    m = member(None)
    m.settle((NextRound(4, x_of(4)),), 0.0, GRACE_S)
    assert m.at is None and m.client.sends == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("owed", [(1,), (0,), (0, 1)])
def test_a_member_borrows_what_it_owes_from_the_lenders_same_round(
    owed: tuple[int, ...],
) -> None:
    m = member(owing(3, owed))
    m.settle((NextRound(3, x_of(3)),), 0.0, GRACE_S)
    at = m.at
    assert at is not None and (at.round, at.missed, at.owed) == (3, False, ())
    np.testing.assert_array_equal(at.params, x_of(3))
    assert m.client.sends == []  # type: ignore[attr-defined]


def test_a_member_pulls_what_it_owes_once_the_lender_is_past_that_round() -> None:
    m = member(owing(3))
    client: FakeClient = m.client  # type: ignore[assignment]
    # the lender missed a round, caught up
    m.settle((NextRound(5, x_of(5), missed=True),), 0.0, GRACE_S)
    assert m.at is None
    assert client.headers() == [(1, Pull(round=3, worker=WORKER))]
    start, stop = RANGES[1]
    values = x_of(3)[start:stop]
    client.core.handle(1, decode(encode(Params(round=3, shards=[1], length=5), values)), 2.0)
    outcome = client.core.outcome
    assert isinstance(outcome, NextRound) and (outcome.round, outcome.owed) == (3, ())
    np.testing.assert_array_equal(outcome.params, x_of(3))


@pytest.mark.parametrize("lent", [NextRound(CFG.rounds, None, missed=True),
                                  NextRound(3, None)], ids=["finished", "no-params"])
def test_a_member_pulls_what_it_owes_when_the_lender_holds_no_params(lent: NextRound) -> None:
    m = member(owing(3, (0, 1)))
    client: FakeClient = m.client  # type: ignore[assignment]
    m.settle((lent,), 0.0, GRACE_S)
    assert m.at is None
    assert client.headers() == [(0, Pull(round=3, worker=WORKER)),
                                (1, Pull(round=3, worker=WORKER))]


def test_a_member_waits_while_the_lenders_exchange_of_that_round_is_under_way() -> None:
    at = owing(3)
    m = member(at)
    # the lender's place before its push of round 2
    m.settle((NextRound(2, x_of(2)),), 0.0, GRACE_S)
    assert m.at is at and m.client.sends == []  # type: ignore[attr-defined]
    m.settle((NextRound(3, x_of(3)),), 0.0, GRACE_S)  # its reply came
    assert m.at is not None and m.at.owed == ()


def test_a_member_that_owes_does_not_push() -> None:
    at = owing(3)
    m = member(at)
    m.push()
    assert m.at is at and m.client.sends == [] and m.step.rounds == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("bare", [True, False])
def test_a_member_pushes_asking_for_bare_params_as_it_is_told(bare: bool) -> None:
    m = member(NextRound(3, x_of(3)), bare=bare)
    m.push()
    assert m.at is None and m.step.rounds == [3]  # type: ignore[attr-defined]
    headers = m.client.headers()  # type: ignore[attr-defined]
    assert [h for _, h in headers] == [
        Push(round=3, worker=WORKER, length=5, pull_next=True, bare_params=bare)] * 2


def test_a_member_that_borrowed_pushes_its_round() -> None:
    m = member(owing(3))
    m.settle((NextRound(3, x_of(3)),), 0.0, GRACE_S)
    m.push()
    assert m.at is None and m.step.rounds == [3]  # type: ignore[attr-defined]


def test_a_member_that_pulls_what_it_owes_records_its_pushed_round_once(tmp_path) -> None:
    """The pushed round's metrics line is written when its push is answered, not again
    when the pull of what a bare reply left out ends."""
    path = tmp_path / "worker-1.jsonl"
    m = WorkerRound(WORKER, Step(), FakeClient(), JsonlWriter(path),  # type: ignore[arg-type]
                at=NextRound(2, x_of(2)), bare=True)
    core = m.client.core
    m.push()
    core.handle(0, decode(encode(Params(round=3, shards=[0], length=5), x_of(3)[:5])), 2.0)
    core.handle(1, decode(encode(Params(round=3, shards=[1], length=5, bare=True))), 2.0)
    m.answered()
    assert m.at is not None and m.at.owed == (1,)
    # the lender is past round 3: pull
    m.settle((NextRound(4, x_of(4), missed=True),), 0.0, GRACE_S)
    core.handle(1, decode(encode(Params(round=3, shards=[1], length=5), x_of(3)[5:])), 3.0)
    m.answered()
    m.metrics.close()
    assert [r["round"] for r in read_jsonl(path)] == [2]
    assert m.at is not None and (m.at.round, m.at.owed, m.at.missed) == (3, (), False)
    np.testing.assert_array_equal(m.at.params, x_of(3))


def test_a_member_borrows_from_the_lenders_place_before_its_latest() -> None:
    """The lender's last round's ACK came at once, before this member's bare reply was
    read: its values of the round before are still at hand, no servers asked."""
    m = member(owing(CFG.rounds - 1))
    m.settle((NextRound(CFG.rounds, None), NextRound(CFG.rounds - 1, x_of(CFG.rounds - 1))),
             0.0, GRACE_S)
    assert m.at is not None and m.at.owed == () and m.client.sends == []  # type: ignore[attr-defined]
    np.testing.assert_array_equal(m.at.params, x_of(CFG.rounds - 1))


def test_a_member_asks_the_servers_once_its_lender_is_late_past_the_grace() -> None:
    """The lender's reply was lost or a server restarted behind: the member does not wait
    on it for ever."""
    m = member(owing(3))
    m.owed_since = 100.0
    m.settle((NextRound(2, x_of(2)),), 100.0 + GRACE_S / 2, GRACE_S)
    assert m.at is not None and m.client.sends == []  # type: ignore[attr-defined]
    m.settle((NextRound(2, x_of(2)),), 100.0 + GRACE_S * 2, GRACE_S)
    assert m.at is None
    assert m.client.headers() == [(1, Pull(round=3, worker=WORKER))]  # type: ignore[attr-defined]


def test_a_workers_round_goes_through_its_phases() -> None:
    """READY -> PUSHING -> OWING (bare from server 1) -> FILLING (the lender is past the
    round) -> READY -> PUSHING -> DONE (the last round's ACKs)."""
    m = member(NextRound(CFG.rounds - 2, x_of(CFG.rounds - 2)))
    core = m.client.core
    assert m.phase is Phase.READY and not m.waiting
    m.push()
    assert m.phase is Phase.PUSHING and m.waiting and m.at is None
    t = CFG.rounds - 1
    core.handle(0, decode(encode(Params(round=t, shards=[0], length=5), x_of(t)[:5])), 2.0)
    core.handle(1, decode(encode(Params(round=t, shards=[1], length=5, bare=True))), 2.0)
    m.answered()
    assert m.phase is Phase.OWING and m.at is not None and m.at.owed == (1,)
    m.push()  # owing: nothing to compute from yet
    assert m.phase is Phase.OWING
    m.settle((NextRound(CFG.rounds, None),), 3.0, GRACE_S)  # the lender has finished
    assert m.phase is Phase.FILLING and m.waiting
    core.handle(1, decode(encode(Params(round=t, shards=[1], length=5), x_of(t)[5:])), 4.0)
    m.answered()
    assert m.phase is Phase.READY
    np.testing.assert_array_equal(m.at.params, x_of(t))
    m.push()
    for s in (0, 1):
        core.handle(s, decode(encode(Ack(round=t, worker=WORKER))), 5.0)
    m.answered()
    assert m.phase is Phase.DONE and not m.waiting
    m.push()
    assert m.phase is Phase.DONE  # nothing after the last round


def test_a_push_whose_round_closed_without_the_worker_catches_up_ready() -> None:
    m = member(NextRound(2, x_of(2)), bare=False)
    core = m.client.core
    m.push()
    stale = Error(code=ErrorCode.STALE_ROUND.value, message="closed", round=4)
    core.handle(0, decode(encode(stale)), 2.0)  # round 2 closed without it: pull round 4
    for s, (a, b) in enumerate(RANGES):
        core.handle(s, decode(encode(Params(round=4, shards=[s], length=5), x_of(4)[a:b])),
                    3.0)
    m.answered()
    assert m.phase is Phase.READY and (m.at.round, m.at.missed) == (4, True)
