"""The default replay window and checkpoint interval (``common/run/replay.py``): the paper's
models as always, a large model within the memory budget, and the two always matching
(what ``ps-cluster`` and the compose generator check before starting anything)."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from common.run.replay import (
    GENERATIONS,
    MIN_REPLAY_ROUNDS,
    REPLAY_BUDGET_BYTES,
    REPLAY_SLACK,
    default_checkpoint_every,
    default_replay_rounds,
)
from server.options import ServerOptions, check_replayable
from worker.options import ClientOptions

MLP, CNN, WIDE, RESNET18 = 118_282, 2_431_018, 10_630_666, 11_173_962


def test_the_paper_s_models_keep_18_rounds_and_save_every_8() -> None:
    for d in (MLP, CNN):
        assert (default_replay_rounds(d), default_checkpoint_every(d)) == (18, 8)


@pytest.mark.parametrize(("d", "window", "every"), [(WIDE, 6, 2), (RESNET18, 6, 2),
                                                    (100_000_000, MIN_REPLAY_ROUNDS, 1)])
def test_a_large_model_keeps_what_the_budget_holds_and_saves_to_match(
        d: int, window: int, every: int) -> None:
    assert (default_replay_rounds(d), default_checkpoint_every(d)) == (window, every)
    assert window * 4 * d <= REPLAY_BUDGET_BYTES or window == MIN_REPLAY_ROUNDS


@pytest.mark.parametrize("d", [1, 1000, MLP, CNN, 5_000_000, WIDE, RESNET18, 10**9])
def test_the_defaults_always_pass_the_launcher_s_check(d: int) -> None:
    every = ServerOptions().checkpoint_interval(d)
    window = ClientOptions().replay_window(d)
    check_replayable(every, window, generations=GENERATIONS)
    assert window - GENERATIONS * every <= REPLAY_SLACK + 1  # and the interval is not wasted


def test_given_values_win_over_the_defaults_and_are_still_checked() -> None:
    assert ServerOptions(checkpoint_every=5).checkpoint_interval(WIDE) == 5
    assert ClientOptions(replay_rounds=30).replay_window(WIDE) == 30
    with pytest.raises(ConfigError, match="--checkpoint-every 8 needs --replay-rounds of at "
                       "least 10 \\(got 6\\)"):
        check_replayable(8, ClientOptions().replay_window(WIDE))
