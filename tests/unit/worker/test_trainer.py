"""Unit tests of worker/trainer.py: the flat-storage gradient equals the plain one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common.learn.data import load_dataset, minibatch_indices
from common.learn.models import build_model, flatten_gradients, load_flat_parameters
from common.learn.seeding import derive_int_seed
from common.run.config import RunConfig
from common.run.model_init import initial_parameters
from worker.trainer import GradientComputer


def plain_gradient(cfg: RunConfig, computer: GradientComputer, x: np.ndarray, round_: int,
                   worker: int) -> np.ndarray:
    """The gradient as written out with a model of its own: its parameters loaded one by
    one, backward into fresh ``.grad`` tensors, concatenated."""
    data = computer.dataset
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.seed)
    load_flat_parameters(model, torch.from_numpy(x.copy()))
    model.train()
    idx = minibatch_indices(computer.partitions[worker], cfg.batch_size, cfg.seed, worker,
                            round_)
    index = torch.from_numpy(np.asarray(idx, dtype=np.int64))
    inputs = data.train_x.index_select(0, index)
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(
            derive_int_seed(cfg.seed, "dropout", worker, round_))
        loss = F.cross_entropy(model(inputs), data.train_y.index_select(0, index))
    loss.backward()
    return flatten_gradients(model).numpy()


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_gradient_is_bit_identical_to_the_plain_computation(model: str) -> None:
    cfg = RunConfig(dataset="synthetic", model=model, num_workers=4, rule="mean").validate()
    computer = GradientComputer(cfg, load_dataset("synthetic", seed=cfg.seed))
    x0 = initial_parameters(cfg)
    rng = np.random.default_rng(1)
    for t in range(4):  # a new x each round: the previous round's values must not leak
        x = (x0 + 0.05 * t * rng.standard_normal(x0.size)).astype(np.float32)
        g, _ = computer.gradient(x, t, t % cfg.num_workers)
        expected = plain_gradient(cfg, computer, x, t, t % cfg.num_workers)
        assert np.array_equal(g.view(np.uint32), expected.view(np.uint32))


def test_returned_gradients_are_not_overwritten_by_the_next_one() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=4, rule="mean").validate()
    computer = GradientComputer(cfg, load_dataset("synthetic", seed=cfg.seed))
    x = initial_parameters(cfg)
    first, _ = computer.gradient(x, 0, 0)
    kept = first.copy()
    computer.gradient(x, 0, 1)
    assert np.array_equal(first, kept)


def test_read_only_parameters_are_accepted_and_wrong_ones_refused() -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=4, rule="mean").validate()
    computer = GradientComputer(cfg, load_dataset("synthetic", seed=cfg.seed))
    x = initial_parameters(cfg)
    writable, _ = computer.gradient(x, 0, 0)
    x.flags.writeable = False
    read_only, _ = computer.gradient(x, 0, 0)
    assert np.array_equal(writable, read_only)
    with pytest.raises(ValueError, match="float32"):
        computer.gradient(x.astype(np.float64), 0, 0)
    with pytest.raises(ValueError, match="shape"):
        computer.gradient(x[:-1], 0, 0)


def test_workers_computing_from_one_received_array_load_it_once_and_get_their_own_gradients(
        ) -> None:
    """The workers of a process compute one after the other from the same x^t array:
    loaded for the first, kept for the others (a received x^t is only read), each
    gradient bit for bit that of a model loaded afresh; another array is loaded."""
    cfg = RunConfig(dataset="synthetic", model="cnn", num_workers=4, rule="mean").validate()
    data = load_dataset("synthetic", seed=cfg.seed)
    shared, fresh = GradientComputer(cfg, data), GradientComputer(cfg, data)
    x = initial_parameters(cfg)
    loads = []
    original = shared.flat_params.copy_
    shared.flat_params.copy_ = lambda source: (loads.append(1), original(source))[1]
    for worker in range(cfg.num_workers):
        g, _ = shared.gradient(x, 3, worker)
        expected, _ = fresh.gradient(x.copy(), 3, worker)
        assert np.array_equal(g.view(np.uint32), expected.view(np.uint32))
    assert len(loads) == 1
    y = x + np.float32(0.01)
    g, _ = shared.gradient(y, 3, 0)
    assert len(loads) == 2
    assert np.array_equal(g.view(np.uint32), fresh.gradient(y.copy(), 3, 0)[0].view(np.uint32))


def test_resnet18_trains_on_cifar10_read_from_its_official_batches(tmp_path) -> None:
    """CIFAR-10's python batches written as the official ones are, read by the real
    loader from --data-dir, and ResNet-18 (GroupNorm) computing a gradient on them: finite,
    and a step along it lowers the minibatch loss."""
    from tests.unit.common.test_data import write_cifar

    write_cifar(tmp_path / "cifar-10-batches-py", per_batch=16)
    cfg = RunConfig(dataset="cifar10", model="resnet18", num_workers=2, batch_size=8,
                    rule="mean").validate()
    data = load_dataset("cifar10", tmp_path)
    computer = GradientComputer(cfg, data)
    assert computer.d == 11_173_962 and data.input_shape == (3, 32, 32)
    x = initial_parameters(cfg)
    g, loss = computer.gradient(x, 0, 1)
    assert np.isfinite(g).all() and np.isfinite(loss) and np.abs(g).sum() > 0
    _, after = computer.gradient((x - np.float32(0.002) * g).astype(np.float32), 0, 1)
    assert after < loss
