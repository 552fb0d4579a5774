"""The reference engine's shortcut for Byzantine workers: a Byzantine worker that pulled
what the honest workers pulled reuses their gradients instead of recomputing them; its
row must be exactly what recomputing gives (what a ``ps-worker`` process does)."""

from __future__ import annotations

import numpy as np
import pytest

from common.run.config import AttackConfig, RunConfig
from ps.reference import engine
from ps.reference.engine import simulate
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
