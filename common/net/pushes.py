"""Which pushes a shard's receiver takes: one check for the server and the proxy.

The server (``server/shard.py``) takes pushes of its current round only; a proxy
(``ps/proxy/core.py``) knows the server's round only from the replies going back, and
refuses, before it corrupts or holds anything, what the server would certainly refuse.
Both refuse through ``check_push``, with the same codes (each refusal is counted by its
code by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.net.protocol import ErrorCode, Refused
from common.net.wire import FLOAT32


@dataclass(frozen=True)
class PushWindow:
    """The pushes a receiver takes now: from workers ``0..workers-1``, of ``size`` values
    sent as ``dtype`` (the run's ``--wire-dtype``), for rounds ``oldest..newest`` of a run
    of ``rounds`` rounds (``current``: the round it names in its refusals)."""

    workers: int
    rounds: int
    size: int
    current: int
    oldest: int
    newest: int
    dtype: str = FLOAT32


def check_push(window: PushWindow, round_: int, worker: int, length: int,
               finished: bool = False, received: np.ndarray | None = None,
               dtype: str = FLOAT32) -> None:
    """Raise ``Refused`` for a push of ``round_`` by ``worker`` of ``length`` values that
    ``window`` does not take, checked in this order: UNKNOWN_WORKER (worker outside the
    run), STALE_ROUND (before ``oldest``), FINISHED (``finished``: the run is over, or
    whatever the caller counts as such), WRONG_ROUND (after ``newest``, or past the run),
    DUPLICATE (``received[worker]``: this worker's push of the round is in already),
    WRONG_LENGTH (not the shard's size), WRONG_DTYPE (values sent as another ``dtype``
    than the run's)."""
    if not 0 <= worker < window.workers:
        raise Refused(ErrorCode.UNKNOWN_WORKER,
                      f"worker {worker} is not in 0..{window.workers - 1}")
    if round_ < window.oldest:
        raise Refused(ErrorCode.STALE_ROUND,
                      f"push for round {round_}, current round is {window.current}")
    if finished:
        raise Refused(ErrorCode.FINISHED, f"push for round {round_}; the run finished "
                      f"after {window.rounds} rounds")
    if round_ > window.newest or round_ >= window.rounds:
        raise Refused(ErrorCode.WRONG_ROUND, f"push for round {round_}, current round is "
                      f"{window.current}; the run has {window.rounds} rounds")
    if received is not None and received[worker]:
        raise Refused(ErrorCode.DUPLICATE, f"worker {worker} already pushed round {round_}")
    if length != window.size:
        raise Refused(ErrorCode.WRONG_LENGTH,
                      f"push has {length} values, the shard has {window.size}")
    if dtype != window.dtype:
        raise Refused(ErrorCode.WRONG_DTYPE,
                      f"push sent as {dtype}, the run's --wire-dtype is {window.dtype}")
