"""The reference engine's shortcut for Byzantine workers: a Byzantine worker that pulled
what the honest workers pulled reuses their gradients instead of recomputing them; its
row must be exactly what recomputing gives (what a ``ps-worker`` process does)."""

from __future__ import annotations

import numpy as np
import pytest

from common.learn.data import load_dataset
from common.run.config import AttackConfig, RunConfig
from ps.reference import engine
from ps.reference.engine import simulate
from ps.reference.participation import Participation
from worker import step as worker_step


@pytest.mark.parametrize("attack_name", ["omniscient", "gaussian", "alie"])
def test_reused_honest_gradients_give_the_recomputed_rows(attack_name: str,
                                                         monkeypatch) -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=6, num_shards=2, rounds=4, rule="meamed",
                    q=2).validate()
    attack = AttackConfig.build(worker_attack=attack_name,
                                byzantine_workers=(0, 3)).validate(cfg)
    shortcut = simulate(cfg, attack)
    recomputed_rows = []
    original = worker_step.byzantine_gradient

    def counting(*args, **kwargs):
        recomputed_rows.append(args[4])
        return original(*args, **kwargs)

    monkeypatch.setattr(worker_step, "byzantine_gradient", counting)
    monkeypatch.setattr(engine.Simulation, "_pulled_alike",
                        staticmethod(lambda views, worker, others: False))
    recomputed = simulate(cfg, attack)
    assert len(recomputed_rows) == 2 * cfg.rounds  # the slow path really ran
    assert shortcut.digest == recomputed.digest
    np.testing.assert_array_equal(shortcut.params, recomputed.params)


def test_listed_byzantine_workers_without_an_attack_compute_honestly() -> None:
    """``--byzantine-workers`` with ``--worker-attack none`` (a grid's no-attack column):
    every worker computes honestly, as a worker process does (``is_byzantine``)."""
    cfg = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rounds=3, rule="meamed",
                    q=1).validate()
    listed = AttackConfig.build(worker_attack="none", byzantine_workers=(4,)).validate(cfg)
    assert simulate(cfg, listed).digest == simulate(cfg, AttackConfig()).digest


def _per_worker_per_shard(monkeypatch) -> None:
    """The engine as it was before its shortcuts: each worker pulls a vector of its own
    (compared value by value, loaded into the model each time) and each shard is a
    server process of its own."""
    pulled = engine.Simulation._pulled
    monkeypatch.setattr(engine.Simulation, "_pulled",
                        lambda self, t: [np.array(v, copy=True) for v in pulled(self, t)])
    monkeypatch.setattr(engine.Simulation, "_hosting",
                        lambda self: [[s] for s in range(self.cfg.num_shards)])


@pytest.mark.parametrize(("rule", "settings", "hosted"), [
    # a vector shared by all; shards 0-1 and 3-5 each hosted together around the proxy's
    ("meamed", {"worker_attack": "omniscient", "byzantine_workers": (0, 3),
                "proxy_attack": "gambler", "proxy_shards": (2,)}, [[0, 1], [2], [3, 4, 5]]),
    # PARAMS corrupted: each worker its own vector (Byzantine workers recompute)
    ("marmed", {"worker_attack": "alie", "byzantine_workers": (1,), "proxy_attack": "bitflip",
                "proxy_shards": (0, 4), "corrupt_params": True}, [[0], [1, 2, 3], [4], [5]]),
    # no coordinate-wise rule: one shard a process
    ("krum", {"worker_attack": "omniscient", "byzantine_workers": (2,)},
     [[s] for s in range(6)]),
])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_shared_views_and_hosted_shards_give_the_per_worker_per_shard_digest(
        rule: str, settings: dict, hosted: list[list[int]], momentum: float,
        monkeypatch) -> None:
    """The engine pulls one vector for every worker whose PARAMS no proxy replaced, and
    hosts consecutive shards without a proxy in one ``ShardGroup`` with a coordinate-wise
    rule: the same bits as a vector of its own for each worker and a group for each
    shard."""
    cfg = RunConfig(dataset="synthetic", num_workers=7, num_shards=6, rounds=5, rule=rule,
                    q=1, worker_momentum=momentum).validate()
    attack = AttackConfig.build(**settings).validate(cfg)
    fast = simulate(cfg, attack)
    sim = engine.Simulation(cfg, attack, load_dataset("synthetic", None, seed=cfg.seed))
    assert [group.shards for group in sim.groups] == [tuple(s) for s in hosted]
    views = sim._pulled(0)
    assert (len({id(v) for v in views}) == 1) == (not attack.corrupt_params)
    _per_worker_per_shard(monkeypatch)
    slow = simulate(cfg, attack)
    assert fast.digest == slow.digest
    assert fast.corrupted_values == slow.corrupted_values


def test_a_recorded_participation_hosts_each_shard_alone() -> None:
    """Shards closed rounds with other workers in a recorded run: one process each."""
    cfg = RunConfig(dataset="synthetic", num_workers=5, num_shards=3, rounds=3, rule="meamed",
                    q=1).validate()
    dataset = load_dataset("synthetic", None, seed=cfg.seed)
    recorded = Participation({(1, 1): (0, 1, 2, 4)})
    sim = engine.Simulation(cfg, AttackConfig(), dataset, recorded)
    assert [group.shards for group in sim.groups] == [(0,), (1,), (2,)]
    assert [group.shards for group in engine.Simulation(cfg, AttackConfig(), dataset).groups] \
        == [(0, 1, 2)]


@pytest.mark.parametrize(("rule", "scenario"), [
    ("mean", {"proxy_attack": "bitflip", "proxy_shards": (0,)}),
    ("krum", {"proxy_attack": "gambler", "proxy_shards": (0,), "gambler_p": 0.05}),
    ("mean", {"worker_attack": "omniscient", "byzantine_workers": (0, 1)}),
])
def test_a_broken_run_settles_bit_for_bit(rule: str, scenario: dict, monkeypatch) -> None:
    """``settle_broken``: once every parameter is NaN the engine stops computing rounds,
    and every round it reports, and the final digest, are bit for bit the full run's."""
    cfg = RunConfig(dataset="synthetic", num_workers=7, num_shards=3, rounds=12, rule=rule,
                    q=2).validate()
    attack = AttackConfig.build(**scenario).validate(cfg)

    def run(settle: bool) -> tuple[list[bytes], str, int]:
        seen: list[bytes] = []
        steps = []
        original = engine.Simulation.step

        def counted(self):
            steps.append(1)
            return original(self)

        monkeypatch.setattr(engine.Simulation, "step", counted)
        result = simulate(cfg, attack, settle_broken=settle,
                          on_round=lambda t, sim: seen.append(sim.params().tobytes()))
        return seen, result.digest, len(steps)

    full, full_digest, full_steps = run(False)
    settled, settled_digest, settled_steps = run(True)
    assert full_steps == cfg.rounds and settled_steps < cfg.rounds  # it did settle
    assert np.isnan(np.frombuffer(full[-1], dtype=np.float32)).all()
    assert settled == full and settled_digest == full_digest


def test_a_run_that_survives_never_settles() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=7, num_shards=3, rounds=6, rule="marmed",
                    q=2).validate()
    attack = AttackConfig.build(proxy_attack="bitflip", proxy_shards=(0,)).validate(cfg)
    assert simulate(cfg, attack, settle_broken=True).digest == simulate(cfg, attack).digest
