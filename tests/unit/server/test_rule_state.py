"""A stateful rule (centered clipping) and the pre-aggregation chain inside a server's
shard: the state crosses rounds, partial rounds and a checkpoint file, and a server
resumed mid-run ends bit-identical to one that never stopped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import ConfigError
from common.learn.rules import make_rule
from common.learn.seeding import derive_rng
from common.run.config import RunConfig
from server.checkpoint import Checkpoint, Expected, load_checkpoint, save_checkpoint
from server.core import ServerCore
from server.group import ShardGroup
from server.options import ServerOptions

CFG = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rule="centered-clipping",
                cc_tau=0.5, cc_iters=2, pre="arc", q=1, lr=0.1, rounds=9, seed=4).validate()
INITIAL = np.linspace(-1.0, 1.0, 12, dtype=np.float32)
SHARD = 1  # holds INITIAL[6:12]


def gradient(t: int, worker: int, size: int) -> np.ndarray:
    g = derive_rng(0, "test-gradient", t, worker).standard_normal(size).astype(np.float32)
    return g * np.float32(worker + 1) + np.float32(t)


def run_rounds(group: ShardGroup, stop: int, workers: list[int] | None = None) -> None:
    while group.round < stop:
        for i in workers if workers is not None else range(group.cfg.num_workers):
            group.push(group.round, i, gradient(group.round, i, group.size))
        group.step()


def core(cfg: RunConfig = CFG) -> ServerCore:
    return ServerCore(cfg, ServerOptions(shard=SHARD), INITIAL)


def test_the_state_is_the_previous_aggregate_and_moves_every_round() -> None:
    server = core()
    assert server.state.states[0].rule_state == {}
    before = server.state.states[0].params.copy()
    run_rounds(server.state, 1)
    center = server.state.states[0].rule_state["center"]
    np.testing.assert_array_equal(server.state.states[0].params, before - np.float32(0.1) * center)
    run_rounds(server.state, 2)
    assert not np.array_equal(server.state.states[0].rule_state["center"], center)


def test_a_resumed_server_ends_bit_identical_to_an_uninterrupted_one(tmp_path: Path) -> None:
    straight = core()
    run_rounds(straight.state, CFG.rounds)

    first = core()
    run_rounds(first.state, 4)
    path = tmp_path / "shard-1.npz"
    save_checkpoint(path, first.snapshot()[0], key=None)
    del first  # the process dies here

    ckpt = load_checkpoint(path, key=None, expect=Expected.of(CFG, SHARD, size=6))
    assert ckpt.round == 4 and set(ckpt.rule_state) == {"center"}
    resumed = core()
    resumed.restore([ckpt])
    run_rounds(resumed.state, CFG.rounds)
    np.testing.assert_array_equal(resumed.state.states[0].params, straight.state.states[0].params)
    np.testing.assert_array_equal(resumed.state.states[0].rule_state["center"],
                                  straight.state.states[0].rule_state["center"])


def test_without_its_state_the_resumed_run_would_differ(tmp_path: Path) -> None:
    straight = core()
    run_rounds(straight.state, CFG.rounds)
    first = core()
    run_rounds(first.state, 4)
    ckpt = first.snapshot()[0]
    resumed = core()
    with pytest.raises(ConfigError, match="holds no state for rule centered-clipping"):
        resumed.restore([Checkpoint(ckpt.shard, ckpt.round, ckpt.config_hash, ckpt.params)])
    # what a lost state would do: restart clipping around zero
    resumed.state.states[0].restore(ckpt.round, ckpt.params, rule_state={
        "center": np.zeros(resumed.state.states[0].size, dtype=np.float32)})
    run_rounds(resumed.state, CFG.rounds)
    assert not np.array_equal(resumed.state.states[0].params, straight.state.states[0].params)


def test_a_state_of_the_wrong_size_is_refused() -> None:
    server = core()
    with pytest.raises(ConfigError, match="rule state 'center' holds 3 values, shard 1 has 6"):
        shard = server.state.states[0]
        shard.restore(2, shard.params, rule_state={"center": np.zeros(3)})


def test_checkpoint_files_round_trip_the_rule_state(tmp_path: Path) -> None:
    path = tmp_path / "shard-0.npz"
    center = np.arange(4, dtype=np.float32)
    expect = Expected(shard=0, rounds=9, config_hash="h", size=4)
    save_checkpoint(path, Checkpoint(0, 3, "h", np.ones(4, dtype=np.float32),
                                     rule_state={"center": center}), key=b"k" * 32)
    loaded = load_checkpoint(path, key=b"k" * 32, expect=expect)
    np.testing.assert_array_equal(loaded.rule_state["center"], center)
    save_checkpoint(path, Checkpoint(0, 3, "h", np.ones(4, dtype=np.float32)), key=None)
    assert load_checkpoint(path, key=None, expect=expect).rule_state == {}


def test_a_partial_round_carries_the_state_through_its_own_rule() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=5, num_shards=1, rule="centered-clipping",
                    q=1, rounds=5).validate()
    group = ShardGroup(cfg, [0], np.zeros(6, dtype=np.float32))
    state = group.states[0]
    run_rounds(group, 1)
    run_rounds(group, 2, workers=[0, 1, 3, 4])  # closed at its deadline without worker 2
    assert state.defence.for_rows(4)[1] is not state.defence.rule
    # the same two rounds by hand: one rule, its center carried
    rule = make_rule("centered-clipping", 5, 1)
    rule(torch.from_numpy(np.stack([gradient(0, i, 6) for i in range(5)])))
    partial = make_rule("centered-clipping", 4, 1)
    partial.set_state(rule.get_state())
    out = partial(torch.from_numpy(np.stack([gradient(1, i, 6) for i in (0, 1, 3, 4)]))).numpy()
    np.testing.assert_array_equal(state.rule_state["center"], out)


def test_the_pre_chain_runs_before_the_rule_with_the_bucketed_rows() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=6, num_shards=1, rule="mean",
                    pre="bucketing", bucket_size=2, q=1, rounds=3, seed=2).validate()
    group = ShardGroup(cfg, [0], np.zeros(3, dtype=np.float32))
    state = group.states[0]
    assert state.defence.chain.rows_out == 3 and state.defence.rule.n == 3
    for i in range(6):
        group.push(0, i, gradient(0, i, 3))
    info = group.step()[0][1].rule_info["pre"]
    assert info[0]["pre"] == "bucketing" and sorted(info[0]["permutation"]) == list(range(6))
    # a partial round of 5 rows: ceil(5/2) = 3 buckets of them
    for i in (0, 1, 2, 4, 5):
        group.push(1, i, gradient(1, i, 3))
    assert group.step()[0][1].workers == [0, 1, 2, 4, 5]
    chain, rule = state.defence.for_rows(5)
    assert chain.rows_out == 3 and rule.n == 3
