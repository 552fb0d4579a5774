"""The server core against insiders, on a fake clock: absent workers, bars, budgets.

A Byzantine worker holds a valid key: it may stop answering (then it must cost one
deadline, not one per round), send what breaks a hard limit (then its key is barred),
or send refused messages as fast as it likes (then the replies and log lines it gets
are budgeted).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from common.net.budgets import BARRED, FROM_BARRED, LOG_INTERVAL_S, REFUSAL_BURST, UNANSWERED
from common.net.keys import Identity
from common.net.protocol import Ack, Error, ErrorCode, Hello, Params, ProtocolError, Status
from common.net.transport import Incoming
from common.run.metrics import read_jsonl
from tests.unit.server.test_server_core import (
    CFG5,
    _worker_peer,
    garbage,
    make_core,
    message,
    only,
    push,
)

# -- absent workers -----------------------------------------------------------------


def round_of(core, workers, now: float, pull_next: bool = False) -> list:
    """Each worker of ``workers`` pushes the current round at ``now``."""
    return [r for w in workers for r in push(core, w, now=now, pull_next=pull_next)]


def test_a_worker_missing_at_a_deadline_is_absent_and_later_rounds_do_not_wait_for_it(
        tmp_path: Path) -> None:
    core = make_core(tmp_path, cfg=CFG5, round_timeout="2.0", quorum=4)
    round_of(core, range(4), now=0.0)
    assert core.tick(1.9) == [] and core.state.round == 0
    core.tick(2.0)  # round 0 closes at its deadline without worker 4
    assert core.state.round == 1 and core.absent.tolist() == [False] * 4 + [True]
    round_of(core, range(4), now=3.0)  # round 1: every present worker is in
    assert core.state.round == 2  # at once, no deadline waited
    lines = read_jsonl(tmp_path / "m.jsonl")
    assert [(r["closed"], r["missing"]) for r in lines] == [("deadline", [4]), ("present", [4])]


def test_an_absent_worker_that_pushes_again_is_waited_for_again() -> None:
    core = make_core(cfg=CFG5, round_timeout="2.0", quorum=4)
    round_of(core, range(4), now=0.0)
    core.tick(2.0)
    # the straggler's late push of round 0: stale, but it is there again
    reply = only(push(core, 4, round_=0, now=2.5))
    assert isinstance(reply.header, Error) and reply.header.code == ErrorCode.STALE_ROUND.value
    assert not core.absent[4]
    round_of(core, range(4), now=3.0)
    assert core.state.round == 1  # round 1 waits for worker 4 again ...
    round_of(core, [4], now=3.5)
    assert core.state.round == 2  # ... which catches up


def test_a_hello_makes_an_absent_worker_present() -> None:
    core = make_core(cfg=CFG5, round_timeout="2.0", quorum=4)
    round_of(core, range(4), now=0.0)
    core.tick(2.0)
    assert core.absent[4]
    header = Hello(role="worker", worker=4, config_hash=CFG5.config_hash)
    core.handle(message(header, peer=b"new-socket"), 2.1)
    assert not core.absent[4]


def test_rounds_still_need_the_quorum_when_workers_are_absent() -> None:
    core = make_core(cfg=CFG5, round_timeout="1.0", quorum=4)
    round_of(core, range(4), now=0.0)
    core.tick(1.0)  # worker 4 absent
    round_of(core, range(3), now=2.0)  # 3 present workers pushed; 3 is not the quorum
    assert core.state.round == 1
    assert core.tick(2.5) == [] and core.state.round == 1
    round_of(core, [3], now=2.6)  # the 4th: every present worker is in, quorum met
    assert core.state.round == 2


def test_pull_next_pushes_of_an_early_closed_round_get_the_next_params() -> None:
    core = make_core(cfg=CFG5, round_timeout="1.0", quorum=4)
    round_of(core, range(4), now=0.0)
    core.tick(1.0)
    replies = round_of(core, range(4), now=2.0, pull_next=True)
    assert core.state.round == 2
    assert sorted(r.envelope[0] for r in replies) == [_worker_peer(w) for w in range(4)]
    assert all(isinstance(r.header, Params) and r.header.round == 2 for r in replies)


def test_without_a_deadline_nobody_is_ever_absent() -> None:
    core = make_core(cfg=CFG5, round_timeout="none")
    round_of(core, range(4), now=0.0)
    assert core.tick(1e9) == [] and not core.absent.any() and core.state.round == 0


# -- bars ---------------------------------------------------------------------------


def too_large(identity: Identity | None, peer: bytes = b"thief") -> Incoming:
    error = ProtocolError("message of 2,000,000,000 bytes in 477 frames, larger than any "
                          "legal message here", ErrorCode.TOO_LARGE)
    return Incoming(envelope=[peer], message=None, error=error, frames=[peer],
                    size=2_000_000_000, identity=identity)


def test_a_key_that_sends_a_message_larger_than_any_legal_one_is_barred_and_absent(
        tmp_path: Path) -> None:
    barred: list[tuple[Identity, str]] = []
    core = make_core(tmp_path, cfg=CFG5, round_timeout="1.0", quorum=4)
    core.peers.on_bar = lambda identity, why: barred.append((identity, why))
    thief = Identity("worker", 4)
    assert core.handle(too_large(thief), 0.0) == []  # no reply to a barred key
    assert [i for i, _ in barred] == [thief] and "2,000,000,000 bytes" in barred[0][1]
    assert core.counters[BARRED] == 1 and core.absent[4]
    # whatever it sends from now on is dropped unanswered, counted
    hello = Hello(role="worker", worker=4, config_hash=CFG5.config_hash)
    assert core.handle(message(hello, peer=b"thief", identity=thief), 0.1) == []
    assert core.handle(message(Status(), peer=b"thief", identity=thief), 0.2) == []
    assert core.counters[FROM_BARRED] == 2 and core.absent[4]
    # the rounds go on without it, each as soon as the four others are in
    for t in range(2):
        round_of(core, range(4), now=1.0 + t)
    assert core.state.round == 2
    lines = read_jsonl(tmp_path / "m.jsonl")
    assert all(r["barred"] == ["worker-4"] and r["closed"] == "present" for r in lines)


def test_barring_is_once_and_a_too_large_message_without_keys_is_only_refused() -> None:
    barred: list[Identity] = []
    core = make_core(cfg=CFG5)
    core.peers.on_bar = lambda identity, why: barred.append(identity)
    core.bar(Identity("worker", 1), "over-long in flight")
    core.bar(Identity("worker", 1), "again")
    assert barred == [Identity("worker", 1)] and core.counters[BARRED] == 1
    reply = only(core.handle(too_large(None), 0.0))  # --insecure: nobody to bar
    assert reply.header.code == ErrorCode.TOO_LARGE.value and len(barred) == 1


# -- budgets ------------------------------------------------------------------------


def test_refusals_beyond_a_keys_rate_are_dropped_without_reply() -> None:
    core = make_core(cfg=CFG5)
    thief = Identity("worker", 2)
    bad = garbage([b"thief"])
    bad.identity = thief
    answered = sum(bool(core.handle(bad, 0.0)) for _ in range(1000))
    assert answered == REFUSAL_BURST  # all at one instant: the burst, then nothing
    assert core.counters[UNANSWERED] == 1000 - REFUSAL_BURST
    assert core.counters[ErrorCode.MALFORMED.value] == 1000
    assert core.handle(bad, 1.0)  # the rate refills
    # another key's refusals are answered: budgets are per key
    other = garbage([b"other"])
    other.identity = Identity("worker", 3)
    assert core.handle(other, 0.0)


def test_refusals_are_logged_once_per_key_and_interval_with_a_count(caplog) -> None:
    core = make_core(cfg=CFG5)
    bad = garbage([b"thief"])
    bad.identity = Identity("worker", 2)
    bad.error = ProtocolError("undecodable header: " + "x" * 260_000)
    with caplog.at_level(logging.INFO, logger="ps.server"):
        for i in range(500):
            core.handle(bad, i * 0.01)  # 5 s of refusals
        core.handle(bad, LOG_INTERVAL_S + 0.1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert all(len(line) < 400 and "worker-2" in line for line in lines)
    assert "499 more refusals" in lines[1]


def test_hellos_are_logged_once_per_peer_and_interval(caplog) -> None:
    core = make_core(cfg=CFG5)
    header = Hello(role="worker", worker=1, config_hash=CFG5.config_hash)
    with caplog.at_level(logging.INFO, logger="ps.server"):
        for i in range(300):
            peer = b"socket-%d" % i
            reply = only(core.handle(message(header, peer=peer, identity=Identity("worker", 1)),
                                     i * 0.001))
            assert not isinstance(reply.header, Error)
    assert sum("hello from" in r.getMessage() for r in caplog.records) == 1


def test_a_proxys_budget_is_per_key_whatever_envelope_it_names() -> None:
    """Issue 35: a proxy key's holder picks the envelope frames; a new one per message
    must not buy a new budget (1,000 garbage messages got 1,000 replies and log lines)."""
    core = make_core(cfg=CFG5)
    proxy = Identity("proxy", 0)
    replies = 0
    for i in range(1000):
        bad = garbage([b"proxy-conn", b"made-up-%d" % i])
        bad.identity = proxy
        replies += len(core.handle(bad, 0.0))
    assert replies == int(REFUSAL_BURST)
    assert core.counters["unanswered"] == 1000 - int(REFUSAL_BURST)


def test_an_accepted_push_is_never_budgeted() -> None:
    core = make_core(cfg=CFG5)
    for t in range(3):
        acks = [r for w in range(5) for r in push(core, w, now=float(t))]
        assert all(r.header == Ack(round=t, worker=r.header.worker) for r in acks)
    np.testing.assert_equal(core.state.round, 3)


@pytest.mark.parametrize("identity", [Identity("proxy", 1), Identity("server", 0)],
                         ids=["another-process-proxy", "a-server-key"])
def test_a_key_outside_its_scope_is_forbidden_at_this_server(identity: Identity) -> None:
    core = make_core(cfg=CFG5)
    hello = Hello(role="worker", worker=1, config_hash=CFG5.config_hash)
    reply = only(core.handle(message(hello, identity=identity), 0.0))
    assert reply.header.code == ErrorCode.FORBIDDEN.value
    assert "not admitted at server-0" in reply.header.message
