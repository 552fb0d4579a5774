"""The server's round logic without sockets: validation, aggregation step, history
(a shard alone in its process: a ``ShardGroup`` of one, pushed as the server does)."""

from __future__ import annotations

import numpy as np
import pytest

from common.net.protocol import ErrorCode, Refused
from common.run.config import RunConfig
from server.group import ShardGroup
from server.shard import HISTORY_ROUNDS


def _state(rule: str = "mean", n: int = 3, rounds: int = 10, lr: float = 0.5,
           **schedule) -> ShardGroup:
    cfg = RunConfig(dataset="synthetic", num_workers=n, num_shards=1, rule=rule, q=0,
                    lr=lr, rounds=rounds, **schedule).validate()
    return ShardGroup(cfg, [0], np.ones(4, dtype=np.float32))


def _push_all(state: ShardGroup, rows: list[list[float]]) -> None:
    for i, row in enumerate(rows):
        state.push(state.round, i, np.asarray(row, dtype=np.float32))


def test_step_applies_lr_times_aggregate() -> None:
    state = _state("mean")
    _push_all(state, [[1, 2, 3, 4], [3, 2, 1, 0], [2, 2, 2, 2]])
    assert state.complete
    [(_, metrics)] = state.step()
    np.testing.assert_allclose(state.states[0].params, 1 - 0.5 * np.array([2, 2, 2, 2]))
    assert metrics.round == 0 and state.round == 1 and not state.complete
    assert metrics.nonfinite_values == 0 and metrics.params_finite


def test_each_round_applies_the_rate_of_its_step_schedule() -> None:
    """--lr-milestones 2,3 with --lr-decay 0.5: rounds 0-1 step by 0.5 x the aggregate,
    round 2 by 0.25, round 3 on by 0.125 (float32 products, as the engine's)."""
    state = _state("mean", lr=0.5, lr_milestones=(2, 3), lr_decay=0.5)
    moved = []
    for _ in range(5):
        before = state.states[0].params.copy()
        _push_all(state, [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
        state.step()
        moved.append(float((before - state.states[0].params)[0]))
    assert moved == [0.5, 0.5, 0.25, 0.125, 0.125]


def test_marmed_ignores_a_minority_of_huge_values() -> None:
    state = _state("marmed")
    _push_all(state, [[1, 1, 1, 1], [-1e20, np.nan, np.inf, 1], [1, 1, 1, 1]])
    [(_, metrics)] = state.step()
    np.testing.assert_array_equal(state.states[0].params, np.full(4, 0.5, dtype=np.float32))
    assert metrics.nonfinite_values == 2


def test_a_model_the_attack_broke_is_reported_without_numpy_warnings() -> None:
    """Mean over an infinite row: the parameters turn infinite, then NaN (inf - inf);
    ``params_finite`` says so each round, and numpy warns of nothing (a server under a
    winning attack would print its RuntimeWarning in every process)."""
    import warnings

    state = _state("mean")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for row in ([np.inf] * 4, [-np.inf] * 4):
            _push_all(state, [row, [1, 1, 1, 1], [1, 1, 1, 1]])
            [(_, metrics)] = state.step()
            assert not metrics.params_finite
    assert np.isnan(state.states[0].params).all()


@pytest.mark.parametrize(
    ("round_", "worker", "length", "code"),
    [
        (0, 5, 4, ErrorCode.UNKNOWN_WORKER),
        (0, -1, 4, ErrorCode.UNKNOWN_WORKER),
        (1, 0, 4, ErrorCode.WRONG_ROUND),
        (0, 0, 3, ErrorCode.WRONG_LENGTH),
    ],
)
def test_bad_pushes_are_refused(round_: int, worker: int, length: int, code: ErrorCode) -> None:
    state = _state()
    with pytest.raises(Refused) as info:
        state.push(round_, worker, np.zeros(length, dtype=np.float32))
    assert info.value.code is code


def test_duplicate_and_stale_pushes_are_refused() -> None:
    state = _state()
    state.push(0, 1, np.zeros(4, dtype=np.float32))
    with pytest.raises(Refused) as info:
        state.push(0, 1, np.zeros(4, dtype=np.float32))
    assert info.value.code is ErrorCode.DUPLICATE
    state.push(0, 0, np.zeros(4, dtype=np.float32))
    state.push(0, 2, np.zeros(4, dtype=np.float32))
    state.step()
    with pytest.raises(Refused) as info:
        state.push(0, 0, np.zeros(4, dtype=np.float32))
    assert info.value.code is ErrorCode.STALE_ROUND


def test_history_keeps_recent_rounds_and_refuses_older() -> None:
    state = _state(rounds=10)
    snapshots = {0: state.states[0].params.copy()}
    for t in range(HISTORY_ROUNDS + 2):
        _push_all(state, [[t, t, t, t]] * 3)
        state.step()
        snapshots[t + 1] = state.states[0].params.copy()
    current = state.round
    for r in range(current - HISTORY_ROUNDS + 1, current + 1):
        np.testing.assert_array_equal(state.states[0].params_at(r), snapshots[r])
    assert state.states[0].params_at(current + 1) is None  # future: parked by the node
    with pytest.raises(Refused) as info:
        state.states[0].params_at(0)
    assert info.value.code is ErrorCode.STALE_ROUND
    with pytest.raises(Refused) as info:
        state.states[0].params_at(11)
    assert info.value.code is ErrorCode.WRONG_ROUND


def test_finished_shard_refuses_pushes() -> None:
    state = _state(rounds=1)
    _push_all(state, [[0, 0, 0, 0]] * 3)
    state.step()
    assert state.finished
    with pytest.raises(Refused) as info:
        state.push(1, 0, np.zeros(4, dtype=np.float32))
    assert info.value.code is ErrorCode.FINISHED
