"""Sessions of a server: the bounded table of peers that said HELLO, and what a key may send."""

from __future__ import annotations

import pytest

from common.net.keys import Identity
from common.net.protocol import ErrorCode, Header, Hello, Pull, Push, Refused, Status
from common.net.scopes import check_claim
from server.sessions import MAX_SESSIONS_PER_PRINCIPAL, Session, Sessions

WORKER_1 = Session("worker", 1, None)
EVALUATOR = Session("evaluator", -1, None)


def peer(i: int) -> tuple[bytes, ...]:
    return (b"peer-%d" % i,)


# -- Sessions ------------------------------------------------------------------------


def test_open_then_require_gives_the_session() -> None:
    sessions = Sessions()
    assert sessions.open(peer(0), WORKER_1) == []
    assert peer(0) in sessions and len(sessions) == 1
    assert sessions.require(peer(0)) == WORKER_1


def test_require_of_an_unknown_peer_is_hello_first() -> None:
    with pytest.raises(Refused) as refused:
        Sessions().require(peer(0))
    assert refused.value.code is ErrorCode.HELLO_FIRST


def test_renewing_a_peer_replaces_its_session_without_growing() -> None:
    sessions = Sessions(per_principal=2)
    sessions.open(peer(0), WORKER_1)
    for _ in range(5):
        assert sessions.open(peer(0), WORKER_1) == []
    assert sessions.open(peer(0), EVALUATOR) == []  # another HELLO from the same peer
    assert len(sessions) == 1
    assert sessions.require(peer(0)) == EVALUATOR


def test_a_principal_keeps_its_newest_sessions_the_oldest_going_first() -> None:
    sessions = Sessions()
    limit = MAX_SESSIONS_PER_PRINCIPAL
    for i in range(limit):
        assert sessions.open(peer(i), WORKER_1) == []
    assert sessions.open(peer(limit), WORKER_1) == [peer(0)]
    assert sessions.open(peer(limit + 1), WORKER_1) == [peer(1)]
    assert [p for p in map(peer, range(limit + 2)) if p in sessions] == [
        peer(i) for i in range(2, limit + 2)
    ]


def test_principals_are_counted_apart() -> None:
    sessions = Sessions(per_principal=1)
    assert sessions.open(peer(0), WORKER_1) == []
    assert sessions.open(peer(1), Session("worker", 2, None)) == []
    assert sessions.open(peer(2), EVALUATOR) == []
    # the same role and worker under another key is another principal
    assert sessions.open(peer(3), Session("worker", 1, Identity("proxy", 0))) == []
    assert len(sessions) == 4


def test_the_table_drops_the_least_recently_used_session_when_full() -> None:
    sessions = Sessions(limit=3)
    for i in range(3):
        sessions.open(peer(i), Session("worker", i, None))
    sessions.require(peer(0))  # peer 0 is in use: peer 1 is now the least recent
    assert sessions.open(peer(3), Session("worker", 3, None)) == [peer(1)]
    assert sessions.open(peer(4), Session("worker", 4, None)) == [peer(2)]
    assert {p for p in map(peer, range(5)) if p in sessions} == {peer(0), peer(3), peer(4)}


def test_an_evicted_peer_must_hello_again() -> None:
    sessions = Sessions(per_principal=1)
    sessions.open(peer(0), WORKER_1)
    sessions.open(peer(1), WORKER_1)
    with pytest.raises(Refused) as refused:
        sessions.require(peer(0))
    assert refused.value.code is ErrorCode.HELLO_FIRST
    assert sessions.open(peer(0), WORKER_1) == [peer(1)]


# -- check_claim ---------------------------------------------------------------------


def hello(role: str, worker: int) -> Hello:
    return Hello(role=role, worker=worker, config_hash="0" * 16)


def push(worker: int) -> Push:
    return Push(round=0, worker=worker, length=1)


def allowed(identity: Identity | None, header: Header) -> bool:
    try:
        check_claim(identity, header)
    except Refused as refused:
        assert refused.code is ErrorCode.FORBIDDEN
        return False
    return True


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (hello("worker", 3), True),
        (push(3), True),
        (Pull(round=0, worker=3), True),
        (Status(), True),
        (hello("worker", 4), False),
        (push(4), False),
        (hello("evaluator", -1), False),
    ],
)
def test_a_worker_key_speaks_only_for_its_worker(header: Header, ok: bool) -> None:
    assert allowed(Identity("worker", 3), header) is ok


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (hello("evaluator", -1), True),
        (Pull(round=0, worker=-1), True),
        (Status(), True),
        (push(0), False),
        (hello("worker", 0), False),
    ],
)
def test_the_evaluator_key_may_only_read(header: Header, ok: bool) -> None:
    assert allowed(Identity("evaluator"), header) is ok


# Every (key, role claimed, shard, direct or relayed) combination against the scope
# each key has (common/net/keys.py): the expected table is written out here, not derived.
MESSAGES = {
    "hello-worker-3": hello("worker", 3),
    "hello-worker-4": hello("worker", 4),
    "hello-evaluator": hello("evaluator", -1),
    "hello-monitor": hello("monitor", -1),
    "hello-proxy": hello("proxy", -1),
    "push-3": push(3),
    "push-4": push(4),
    "pull": Pull(round=0, worker=3),
    "status": Status(),
}
WORKER_MAY = {"hello-worker-3", "push-3", "pull", "status"}
EVALUATOR_MAY = {"hello-evaluator", "hello-monitor", "pull", "status"}
RELAYED_MAY = {"hello-worker-3", "hello-worker-4", "push-3", "push-4", "pull", "status"}
# (key, shard of the server, envelope depth) -> what it may send there
SCOPES = {
    **{("worker-3", shard, depth): WORKER_MAY for shard in (0, 1) for depth in (1, 2)},
    **{("evaluator", shard, depth): EVALUATOR_MAY for shard in (0, 1) for depth in (1, 2)},
    ("proxy-0", 0, 1): {"hello-proxy"},
    ("proxy-0", 0, 2): RELAYED_MAY,
    ("proxy-0", 1, 1): set(),
    ("proxy-0", 1, 2): set(),
    **{("server-0", shard, depth): set() for shard in (0, 1) for depth in (1, 2)},
    **{(None, shard, depth): set(MESSAGES) for shard in (0, 1) for depth in (1, 2)},
}


@pytest.mark.parametrize(("key", "shard", "depth"), list(SCOPES),
                         ids=[f"{k}@shard{s}/depth{d}" for k, s, d in SCOPES])
def test_each_key_may_send_exactly_what_its_scope_allows(key: str | None, shard: int,
                                                         depth: int) -> None:
    identity = Identity.parse(key) if key else None
    may = {name for name, header in MESSAGES.items()
           if _allowed_at(identity, header, depth, shard)}
    assert may == SCOPES[(key, shard, depth)]


def _allowed_at(identity: Identity | None, header: Header, depth: int, shard: int) -> bool:
    try:
        check_claim(identity, header, depth, shard)
    except Refused as refused:
        assert refused.code is ErrorCode.FORBIDDEN
        return False
    return True
