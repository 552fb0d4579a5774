"""One worker's step (``worker/step.py``): what a worker process and the reference engine
both push for worker i at round t."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.learn.data import load_dataset
from common.run.config import AttackConfig, RunConfig
from common.run.model_init import initial_parameters
from ps.reference.batched import BatchedGradients
from ps.reference.engine import simulate
from worker.byzantine import ByzantineState, byzantine_gradient
from worker.step import WorkerStep
from worker.trainer import GradientComputer

F32 = np.float32
CFG = RunConfig(dataset="synthetic", num_workers=5, num_shards=2, rounds=3, rule="meamed",
                q=1, worker_momentum=0.9, seed=4).validate()
ATTACK = AttackConfig.build(worker_attack="alie", byzantine_workers=(1, 3)).validate(CFG)


@pytest.fixture(scope="module")
def computer() -> GradientComputer:
    return GradientComputer(CFG, load_dataset(CFG.dataset, None, seed=CFG.seed))


def test_an_honest_worker_pushes_the_momentum_of_its_gradients(
        computer: GradientComputer) -> None:
    step = WorkerStep(CFG, ATTACK, computer, 2)
    assert not step.byzantine
    x = initial_parameters(CFG)
    m = np.zeros_like(x)
    for t in range(3):
        g, loss = computer.gradient(x, t, 2)
        m = F32(0.9) * m + F32(1.0 - 0.9) * g
        pushed, pushed_loss = step(x, t)
        np.testing.assert_array_equal(pushed, m)
        assert pushed_loss == loss


def test_a_byzantine_worker_pushes_its_forged_row(computer: GradientComputer) -> None:
    step = WorkerStep(CFG, ATTACK, computer, 3)
    assert step.byzantine
    x = initial_parameters(CFG)
    state = ByzantineState.start(CFG, ATTACK)
    for t in range(2):
        row, loss = step(x, t)
        np.testing.assert_array_equal(
            row, byzantine_gradient(CFG, ATTACK, computer, x, t, 3, state=state))
        assert math.isnan(loss)


@pytest.mark.parametrize("name", ["alie", "signflip", "gaussian", "ipm", "inf"])
def test_a_byzantine_row_holds_its_own_memory_only(computer: GradientComputer,
                                                   name: str) -> None:
    """A worker keeps its pushes to replay: a view into the forged matrix would keep the
    matrix of every Byzantine worker alive for each of those rounds."""
    attack = AttackConfig.build(worker_attack=name, byzantine_workers=(1, 3)).validate(CFG)
    row, _ = WorkerStep(CFG, attack, computer, 3)(initial_parameters(CFG), 0)
    assert row.base is None and row.nbytes == 4 * computer.d


def test_the_reference_engine_runs_the_workers_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every honest row of the engine's per-worker path is a ``WorkerStep``'s: a changed
    step changes it (the batched path is that path bit for bit: tests/unit/ps/
    test_batched.py)."""
    monkeypatch.setattr(BatchedGradients, "supports",
                        staticmethod(lambda computer, workers: False))
    cfg = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rounds=2, rule="mean",
                    q=0).validate()
    attack = AttackConfig().validate(cfg)
    calls: list[tuple[int, int]] = []
    original = WorkerStep.__call__

    def doubled(self: WorkerStep, x: np.ndarray, round_: int) -> tuple[np.ndarray, float]:
        calls.append((round_, self.worker))
        g, loss = original(self, x, round_)
        return F32(2) * g, loss

    plain = simulate(cfg, attack)
    monkeypatch.setattr(WorkerStep, "__call__", doubled)
    changed = simulate(cfg, attack)
    assert sorted(calls) == [(t, i) for t in range(2) for i in range(3)]
    assert changed.digest != plain.digest
