"""The reference engine's batched honest gradients (``ps/reference/batched.py``): every
worker's pushed vector of every round bit for bit what each worker computing alone
pushes (``Simulation(batched=False)``: what a ``ps-worker`` process computes)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

from common.learn.data import load_dataset
from common.learn.data.idx import DEBIAN_FASHION_MNIST_DIR
from common.run.config import AttackConfig, RunConfig
from ps.reference import batched as batched_module
from ps.reference.batched import BatchedGradients
from ps.reference.engine import Simulation
from worker.trainer import GradientComputer


@pytest.fixture(autouse=True)
def one_thread():
    """As the engine's callers compute (``--torch-threads`` 1, a grid's cells)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pushed_vectors(cfg: RunConfig, attack: AttackConfig, batched: bool) -> list[np.ndarray]:
    """Every vector pushed, round by round (a proxy's forwarded slices too), as the bits
    of float32."""
    sim = Simulation(cfg, attack, load_dataset(cfg.dataset, None, seed=cfg.seed),
                     batched=batched)
    assert (sim.batched is not None) == batched
    vectors = []
    wire = sim._wire

    def recorded(values: np.ndarray) -> np.ndarray:
        vectors.append(values.view(np.uint32).copy())
        return wire(values)

    sim._wire = recorded
    for _ in range(cfg.rounds):
        sim.step()
    if batched:
        assert sim.batched is not None and sim.batched.checked and sim.batched.agrees
    return vectors


def assert_same_bits(cfg: RunConfig, attack: AttackConfig) -> None:
    one_by_one = pushed_vectors(cfg, attack, batched=False)
    together = pushed_vectors(cfg, attack, batched=True)
    assert len(together) == len(one_by_one) >= cfg.rounds * cfg.num_workers  # (a proxy's too)
    for k, (a, b) in enumerate(zip(together, one_by_one, strict=True)):
        assert np.array_equal(a, b), f"pushed vector {k}"


@pytest.mark.parametrize(("run", "attack"), [
    ({"rule": "meamed", "q": 3}, {}),
    ({"rule": "meamed", "q": 3}, {"worker_attack": "omniscient", "byzantine_workers": (0, 4)}),
    ({"rule": "trimmed-mean", "q": 2, "worker_momentum": 0.9},
     {"worker_attack": "alie", "byzantine_workers": (1, 2)}),
    ({"rule": "krum", "q": 2, "worker_momentum": 0.5},
     {"worker_attack": "labelflip", "byzantine_workers": (3,)}),
    ({"rule": "marmed", "q": 2, "num_shards": 3},
     {"proxy_attack": "gambler", "proxy_shards": (1,)}),
    # diverges to inf and NaN: a ReLU's backward passes NaN, as threshold_backward does
    ({"rule": "mean", "q": 0, "lr": 1e4}, {}),
])
def test_batched_gradients_are_each_workers_bit_for_bit(run: dict, attack: dict) -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=8, rounds=6, **run).validate()
    assert_same_bits(cfg, AttackConfig.build(**attack).validate(cfg))


@pytest.mark.skipif(not os.path.isdir(DEBIAN_FASHION_MNIST_DIR),
                    reason=f"{DEBIAN_FASHION_MNIST_DIR} absent")
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_on_fashion_mnist_the_paper_cells_are_bit_for_bit(momentum: float) -> None:
    """The paper's cell (n = 20, MLP, batch 32) and the heterogeneity grid's split."""
    cfg = RunConfig(dataset="fashion-mnist", num_workers=20, rounds=3, rule="meamed", q=8,
                    worker_momentum=momentum, partition="dirichlet", alpha=0.1,
                    iid_workers=(0, 1, 2, 3)).validate()
    assert_same_bits(cfg, AttackConfig.build(worker_attack="alie",
                                             byzantine_workers=(0, 1, 2, 3)).validate(cfg))


def test_a_first_call_that_differs_turns_the_batching_off(monkeypatch, caplog) -> None:
    """Checked against the per-worker path on its first call, the batching is left off
    for the run where any bit differs: the run ends as the per-worker one does."""
    cfg = RunConfig(dataset="synthetic", num_workers=5, rounds=3, rule="meamed",
                    q=1).validate()
    dataset = load_dataset("synthetic", None, seed=cfg.seed)
    compute = BatchedGradients._compute

    def one_bit_off(self, x, round_, workers, outs) -> None:
        compute(self, x, round_, workers, outs)
        outs[-1][7] = np.nextafter(outs[-1][7], np.float32(np.inf))

    monkeypatch.setattr(BatchedGradients, "_compute", one_bit_off)
    sim = Simulation(cfg, AttackConfig(), dataset)
    with caplog.at_level(logging.WARNING, logger="ps.reference"):
        for _ in range(cfg.rounds):
            sim.step()
    assert sim.batched is not None and sim.batched.checked and not sim.batched.agrees
    assert "compute one by one" in caplog.text
    alone = Simulation(cfg, AttackConfig(), dataset, batched=False)
    for _ in range(cfg.rounds):
        alone.step()
    np.testing.assert_array_equal(sim.params(), alone.params())


def test_what_is_batched() -> None:
    """The MLP on the CPU with one torch thread; not the CNN (dropout), not with more
    threads (MKL sums a small product's rows otherwise), not past MAX_VALUES."""
    cfg = RunConfig(dataset="synthetic", num_workers=4, rule="mean", q=0).validate()
    dataset = load_dataset("synthetic", None, seed=cfg.seed)
    computer = GradientComputer(cfg, dataset)
    assert BatchedGradients.supports(computer, 4)
    assert not BatchedGradients.supports(computer, batched_module.MAX_VALUES // computer.d + 1)
    torch.set_num_threads(2)
    assert not BatchedGradients.supports(computer, 4)
    torch.set_num_threads(1)
    cnn = RunConfig(dataset="synthetic-cifar", model="cnn", num_workers=4, rule="mean",
                    q=0).validate()
    cnn_data = load_dataset("synthetic-cifar", None, seed=cnn.seed)
    assert not BatchedGradients.supports(GradientComputer(cnn, cnn_data), 4)
    assert Simulation(cnn, AttackConfig(), cnn_data).batched is None
