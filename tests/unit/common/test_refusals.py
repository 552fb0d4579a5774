"""The one refusal and offence path the server's and the proxy's cores share
(``common.net.refusals``), without a core: each branch once, with a stand-in reply."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np

from common.net.budgets import BARRED, CUT, FROM_BARRED, PeerPolicy
from common.net.keys import Identity
from common.net.protocol import (
    Error,
    ErrorCode,
    Hello,
    ProtocolError,
    Pull,
    Push,
    Refused,
    decode,
    encode,
)
from common.net.refusals import MAX_ERROR_TEXT, Answering
from common.net.transport import Incoming

WORKER = Identity("worker", 1)


def answering() -> tuple[Answering[tuple[list, Error]], Counter[str], list[str]]:
    counters: Counter[str] = Counter()
    barred: list[str] = []
    policy = PeerPolicy(counters, logging.getLogger("test-refusals"))

    def bar(identity: Identity, reason: str) -> None:
        barred.append(identity.name)
        policy.bar(identity, reason)

    return Answering(policy, lambda envelope, error: (envelope, error), lambda: 7, bar,
                     first=0), counters, barred


def incoming(header=None, error: ProtocolError | None = None,
             identity: Identity | None = WORKER) -> Incoming:
    message = None
    if header is not None:
        tensor = np.zeros(header.length, dtype=np.float32) if isinstance(header, Push) else None
        message = decode(encode(header, tensor))
    return Incoming([b"peer"], message, error, [], 10, identity)


def test_an_admitted_message_goes_to_the_handler() -> None:
    answers, counters, _ = answering()
    out = answers.answer(incoming(Pull(round=0, worker=1)), "p", 0.0,
                         lambda message: [("handled", message.header.op.name)])
    assert out == [("handled", "PULL")] and not counters


def test_a_claim_outside_the_keys_scope_is_refused_with_an_error() -> None:
    answers, counters, _ = answering()
    out = answers.answer(incoming(Push(round=0, worker=2, length=1)), "p", 0.0,
                         lambda message: [])
    [(envelope, error)] = out
    assert envelope == [b"peer"] and error.code == ErrorCode.FORBIDDEN.value
    assert error.round == 7 and counters[ErrorCode.FORBIDDEN.value] == 1


def test_a_handlers_refusal_and_bug_are_answered_and_counted(caplog) -> None:
    answers, counters, _ = answering()

    def refuses(message):
        raise Refused(ErrorCode.BUSY, "x" * (3 * MAX_ERROR_TEXT))

    [(_, error)] = answers.answer(incoming(Pull(round=0, worker=1)), "p", 0.0, refuses)
    assert error.code == ErrorCode.BUSY.value
    assert len(error.message) == MAX_ERROR_TEXT + len(" ...")  # a peer's text, bounded

    def breaks(message):
        raise KeyError("a bug")

    with caplog.at_level(logging.ERROR, logger="test-refusals"):
        [(_, error)] = answers.answer(incoming(Pull(round=0, worker=1)), "q", 0.0, breaks)
    assert error.code == ErrorCode.INTERNAL.value and "KeyError" in error.message
    assert counters[ErrorCode.INTERNAL.value] == 1 and "internal error" in caplog.text


def test_an_oversize_message_bars_its_key_and_a_barred_key_is_dropped_unread() -> None:
    answers, counters, barred = answering()
    too_large = ProtocolError("a frame of 9 GB", ErrorCode.TOO_LARGE)
    assert answers.answer(incoming(error=too_large), "p", 0.0, lambda m: []) == []
    assert barred == ["worker-1"] and counters[BARRED] == 1
    assert answers.answer(incoming(Hello(role="worker", worker=1, config_hash="h")), "p", 0.0,
                          lambda m: [("handled",)]) == []
    assert counters[FROM_BARRED] == 1


def test_an_offence_bars_the_key_it_names_or_counts_a_cut() -> None:
    answers, counters, barred = answering()
    answers.offence(None, "an over-long first message", 0.0)
    assert counters[CUT] == 1 and barred == []
    answers.offence(WORKER, "an over-long message", 0.0)
    assert barred == ["worker-1"]
