"""One check of a push for the server and the proxy (``common/net/pushes.py``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from common.net.protocol import ErrorCode, Push, Refused, decode, encode
from common.net.pushes import PushWindow, check_push
from server.group import ShardGroup
from tests.unit.ps.test_proxy_core import CFG, GAMBLER, LENGTH, attack, make_core, push

WINDOW = PushWindow(workers=4, rounds=10, size=5, current=3, oldest=3, newest=4)


def _code(round_: int, worker: int, length: int, finished: bool = False,
          received: np.ndarray | None = None) -> ErrorCode | None:
    try:
        check_push(WINDOW, round_, worker, length, finished, received)
    except Refused as exc:
        return exc.code
    return None


@pytest.mark.parametrize(("round_", "worker", "length", "finished", "code"), [
    (3, 4, 5, False, None),  # (worker 4 is out: see the next row)
    (2, 4, 0, True, ErrorCode.UNKNOWN_WORKER),  # the worker first
    (2, 1, 0, True, ErrorCode.STALE_ROUND),  # then a round before the oldest
    (5, 1, 0, True, ErrorCode.FINISHED),  # then a run that is over
    (5, 1, 0, False, ErrorCode.WRONG_ROUND),  # then a round after the newest
    (4, 1, 0, False, ErrorCode.DUPLICATE),  # then a repeat
    (4, 2, 6, False, ErrorCode.WRONG_LENGTH),  # last, the length
    (4, 2, 5, False, None),
], ids=["unknown-worker", "worker-first", "stale", "finished", "ahead",
        "duplicate", "length", "taken"])
def test_the_checks_come_in_their_documented_order(
    round_: int, worker: int, length: int, finished: bool, code: ErrorCode | None,
) -> None:
    received = np.array([False, True, False, False])
    expected = ErrorCode.UNKNOWN_WORKER if (round_, worker) == (3, 4) else code
    assert _code(round_, worker, length, finished, received) is expected


def test_the_proxy_refuses_a_push_with_the_code_the_server_would_answer() -> None:
    """Over every push of workers, rounds and lengths around the run's bounds, a push the
    proxy refuses (the server at round 0 as far as it knows: it takes rounds 0 and 1) is
    one the server refuses with the same code (at round 0, or at the push's round if that
    is 1); but for the round after the last, which the proxy (unable to
    tell whether the server finished) answers as finished and a running server as a wrong
    round."""
    compared = 0
    for worker, round_, length in itertools.product(
            range(-1, CFG.num_workers + 1), range(-1, CFG.rounds + 2), (LENGTH - 1, LENGTH)):
        core = make_core(attack(**GAMBLER))
        out = core.from_worker(push(worker, round_, length=length))
        codes = [decode(o.frames[2:]).header.code for o in out if not o.to_server]
        if not codes:
            continue
        group = ShardGroup(CFG, [1], np.zeros(LENGTH * CFG.num_shards, dtype=np.float32))
        if round_ == 1:
            group.states[0].restore(1, np.zeros(LENGTH, dtype=np.float32))
        message = decode(encode(Push(round=round_, worker=worker, length=length),
                                np.zeros(length, dtype=np.float32)))
        with pytest.raises(Refused) as refused:
            group.push(round_, worker, message)
        server = refused.value.code
        if round_ == CFG.rounds and server is ErrorCode.WRONG_ROUND:
            server = ErrorCode.FINISHED
        assert codes == [server.value], (worker, round_, length)
        compared += 1
    assert compared > 20


def test_a_round_past_the_run_is_wrong_even_within_the_window() -> None:
    """A proxy that saw the server's last PARAMS (round 10 of 10) takes rounds up to 11
    as far as its window goes; round 11 is still refused."""
    window = PushWindow(workers=4, rounds=10, size=5, current=10, oldest=0, newest=11)
    with pytest.raises(Refused) as refused:
        check_push(window, 11, 1, 5)
    assert refused.value.code is ErrorCode.WRONG_ROUND
