"""Unit tests of worker/trainer.py: the flat-storage gradient equals the plain one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common.config import RunConfig
from common.data import load_dataset, minibatch_indices
from common.model_init import initial_parameters
from common.models import build_model, flatten_gradients, load_flat_parameters
from common.seeding import derive_int_seed
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
