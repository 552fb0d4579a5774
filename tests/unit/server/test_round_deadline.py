"""The default round deadline (``server/deadline.py``): a silent worker costs one
deadline under the default flags, a healthy run never reaches it, ``none`` waits for
all n. Driven through the real server core with a fake clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.errors import ConfigError
from common.net.protocol import Ack
from common.run.config import AttackConfig, RunConfig
from ps.launcher.cluster import ClusterSpec
from server.deadline import AUTO_FIRST_S, AUTO_FLOOR_S, AUTO_HISTORY, AUTO_MAX_S, RoundDeadline
from server.options import ServerOptions, default_quorum
from tests.unit.server.test_server_core import CFG5, hello, make_core, only, push

CFG7 = RunConfig(dataset="synthetic", num_workers=7, num_shards=2, rule="marmed", q=2,
                 lr=0.5, rounds=40).validate()


@pytest.mark.parametrize(("text", "fixed"), [("auto", None), ("AUTO", None), ("2.5", 2.5),
                                             (" 10 ", 10.0)])
def test_round_timeout_reads_auto_or_seconds(text, fixed) -> None:
    deadline = RoundDeadline.parse(text)
    assert deadline is not None and deadline.fixed_s == fixed


def test_round_timeout_none_waits_for_all() -> None:
    assert RoundDeadline.parse("none") is None
    assert ServerOptions(round_timeout="none").rows_needed(CFG5) == 5


@pytest.mark.parametrize("text", ["", "soon", "0", "-3", "inf", "nan"])
def test_an_unreadable_round_timeout_is_a_configuration_error(text) -> None:
    with pytest.raises(ConfigError, match="--round-timeout"):
        ServerOptions(round_timeout=text).check(CFG5)


def test_the_adaptive_deadline_is_a_multiple_of_recent_rounds_with_a_floor_and_a_cap(
        ) -> None:
    deadline = RoundDeadline()
    assert deadline.learning and deadline.seconds() == AUTO_FIRST_S  # the workers' start
    for span in (0.01, 0.02, 0.03):
        deadline.observe(span)
    assert not deadline.learning
    assert deadline.seconds() == AUTO_FLOOR_S  # 10 x 0.02 s is under the floor
    for span in (2.0, 2.0, 2.0, 2.0):
        deadline.observe(span)
    assert deadline.seconds() == pytest.approx(20.0)  # 10 x the median (2.0)
    for _ in range(AUTO_HISTORY):
        deadline.observe(1e6)
    assert deadline.seconds() == AUTO_MAX_S


def test_q_workers_pushing_late_cannot_grow_the_deadline() -> None:
    """A Byzantine worker that pushes just before each deadline: the span is measured to
    the (n - q)-th push, so each round's sample is the honest workers' (before, a span
    to the last push grew the deadline tenfold a round: 5 s, 25, 50, 500, ... 4e5 s)."""
    core = make_core(cfg=CFG7)  # n=7, q=2: the honest span ends at the 5th push
    now = 0.0
    for round_ in range(30):
        first = now
        for w in range(5):
            now = first + 0.01 * (w + 1)
            push(core, w, now=now)
        late = core.deadline()
        assert late is not None
        push(core, 5, now=late - 0.001)
        push(core, 6, now=late - 0.001)
        assert core.state.round == round_ + 1
        now = late + 1.0
    assert core.round_deadline.seconds() == AUTO_FLOOR_S  # 10 x 0.04 s: the floor


def test_q_workers_pushing_early_cannot_grow_the_deadline_or_start_its_clock() -> None:
    """Two Byzantine workers (q = 2) push each round the moment it opens; the honest five
    come 30 s later (their gradients), 0.01 s apart. Counted from the first push, each
    span was 30 s and the deadline grew to 300 s (a silent worker then cost 5 minutes a
    round, past the honest workers' request timeouts); counted from the (q + 1)-th, it
    stays at the floor, and a round one honest worker misses closes a floor after the
    third push."""
    core = make_core(cfg=CFG7)  # n=7, q=2
    now = 0.0
    for round_ in range(AUTO_HISTORY + 2):
        opened = now
        for w in (5, 6):
            push(core, w, now=opened)
        assert core.deadline() is None  # the q early pushes start no clock
        for w in range(5):
            now = opened + 30.0 + 0.01 * w
            push(core, w, now=now)
        assert core.state.round == round_ + 1
    assert core.round_deadline.seconds() == AUTO_FLOOR_S  # 10 x 0.02 s: the floor
    opened = now
    for w in (5, 6):
        push(core, w, now=opened)
    for w in range(4):  # worker 4 has stopped
        push(core, w, now=opened + 30.0 + 0.01 * w)
    assert core.deadline() == pytest.approx(opened + 30.0 + AUTO_FLOOR_S)
    core.tick(opened + 30.0 + AUTO_FLOOR_S)
    assert core.state.round == AUTO_HISTORY + 3 and bool(core.absent[4])


def test_a_fixed_deadline_counts_from_the_push_q_workers_cannot_send_alone() -> None:
    """--round-timeout 2 with q = 2: two early pushes start no clock, so the honest
    workers, 3 s behind them, are all aggregated (counted from the first push, the round
    closed at the quorum's push and the Byzantine workers chose whose push came late)."""
    core = make_core(cfg=CFG7, round_timeout="2.0")
    for w in (5, 6):
        push(core, w, now=0.0)
    for w in range(5):
        core.tick(3.0 + 0.05 * w)
        reply = only(push(core, w, round_=0, now=3.0 + 0.05 * w))
        assert reply.header == Ack(round=0, worker=w)  # none of them stale-round
    assert core.state.round == 1 and not core.absent.any()


def test_the_first_round_waits_for_workers_still_starting() -> None:
    """Until a round told how long one takes, a worker's first HELLO restarts the wait:
    workers seconds or minutes apart at the start are all in round 0."""
    core = make_core(cfg=CFG5)  # q = 1: a round's clock starts at its second push
    push(core, 0, now=0.0)  # (says HELLO at 0)
    assert core.deadline() is None
    push(core, 4, now=0.0)
    assert core.deadline() == pytest.approx(AUTO_FIRST_S)
    hello(core, role="worker", worker=1, peer=b"worker-1")
    core.tick(AUTO_FIRST_S - 1)
    greet_at(core, 2, AUTO_FIRST_S - 1)  # a late starter
    assert core.deadline() == pytest.approx(2 * AUTO_FIRST_S - 1)
    core.tick(2 * AUTO_FIRST_S - 2)
    assert core.state.round == 0
    for w in range(1, 4):
        push(core, w, now=2 * AUTO_FIRST_S - 1.5)
    assert core.state.round == 1 and not core.absent.any()


def test_the_default_quorum_is_n_minus_q_or_the_fewest_rows_the_rule_takes() -> None:
    assert default_quorum(CFG5) == 4
    assert ServerOptions().rows_needed(CFG7) == 5
    krum = RunConfig(dataset="synthetic", num_workers=7, num_shards=1, rule="krum", q=2,
                     rounds=2).validate()
    assert default_quorum(krum) == 7  # Krum needs 2q + 2 < rows: 5 and 6 are too few
    mean = RunConfig(dataset="synthetic", num_workers=4, num_shards=1, rule="mean", q=0,
                     rounds=2).validate()
    assert default_quorum(mean) == 4


def test_a_silent_worker_costs_one_default_deadline_then_rounds_run_at_full_rate() -> None:
    core = make_core(cfg=CFG7)  # the default flags: --round-timeout auto, quorum n - q
    now = 0.0
    for round_ in range(5):  # healthy rounds: all 7 in within 0.06 s of the first push
        for w in range(7):
            now += 0.01
            assert only(push(core, w, now=now)).header.round == round_
        core.tick(now)
        assert core.state.round == round_ + 1
        now += 1.0  # the workers compute: not part of a round's span
    # worker 6 stops answering; the others push round 5
    first = now
    for w in range(6):
        now += 0.01
        push(core, w, now=now)
    # q = 2: the clock started at the third push
    assert core.deadline() == pytest.approx(first + 0.03 + AUTO_FLOOR_S)
    core.tick(first + 0.02 + AUTO_FLOOR_S)
    assert core.state.round == 5  # a healthy straggler has the floor's seconds
    core.tick(first + 0.03 + AUTO_FLOOR_S)
    assert core.state.round == 6 and bool(core.absent[6])
    # from now on a round closes once the six present workers are in: no deadline paid
    now = first + AUTO_FLOOR_S + 1.0
    for w in range(6):
        now += 0.01
        push(core, w, now=now)
    assert core.state.round == 7


def test_a_healthy_run_under_the_default_deadline_equals_one_without() -> None:
    """Workers seconds apart (a slow first round, quick rounds, then a straggler 4 s
    behind: under the floor) close every round with all n, as ``--round-timeout none``
    does."""
    cores = [make_core(cfg=CFG5), make_core(cfg=CFG5, round_timeout="none")]
    for core in cores:
        now = 0.0
        for round_ in range(4):
            # when each worker pushes, after the round's first push: the workers' start
            # in round 0, a straggler 4.9 s behind (under the 5 s floor) in round 3
            offsets = {0: [0, 5, 10, 15, 20], 3: [0, 0.01, 0.02, 0.03, 4.9]}.get(
                round_, [0, 0.01, 0.02, 0.03, 0.04])
            first = now
            for w in range(5):
                now = first + offsets[w]
                core.tick(now)
                ack = push(core, w, now=now)
                assert only(ack).header == Ack(round=round_, worker=w), ack
            now += 1.0
        assert core.state.round == 4 and not core.absent.any()
    np.testing.assert_array_equal(cores[0].state.states[0].params,
                                  cores[1].state.states[0].params)


def test_a_proxy_attack_that_holds_rounds_turns_the_default_deadline_off() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rounds=2).validate()
    holding = AttackConfig.build(proxy_attack="omniscient", proxy_victims=(1,)).validate(cfg)
    spec = ClusterSpec(cfg=cfg, attack=holding, out_dir=Path("unused"))
    assert spec.server.deadline() is None
    plain = ClusterSpec(cfg=cfg, attack=AttackConfig().validate(cfg), out_dir=Path("unused"))
    assert plain.server.deadline() is not None and plain.server.deadline().adaptive


def greet_at(core, worker: int, now: float) -> None:
    """Worker ``worker``'s first HELLO, at ``now``."""
    from common.net.protocol import Hello
    from tests.unit.server.test_server_core import message

    core.handle(message(Hello(role="worker", worker=worker, config_hash=CFG5.config_hash),
                        peer=f"worker-{worker}".encode()), now)
