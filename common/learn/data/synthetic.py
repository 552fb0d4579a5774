"""Synthetic data: class-dependent Gaussian blobs, 10 classes, generated from the seed in
milliseconds: ``synthetic`` of shape (1, 28, 28), learnable by the MLP within tens of SGD
steps; ``synthetic-cifar`` of CIFAR-10's shape (3, 32, 32), for the models built for it
(``cnn``, ``resnet18``) in benchmarks and tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.learn.data.base import NUM_CLASSES, Dataset, DatasetSpec, register_dataset
from common.learn.seeding import derive_rng

SYNTHETIC_SHAPE = (1, 28, 28)
CIFAR_SHAPE = (3, 32, 32)
TRAIN_SAMPLES = 2048
TEST_SAMPLES = 512
_SIGNAL = 0.25  # per-pixel sd of the class means; the noise has sd 1


def synthetic(seed: int, num_train: int, num_test: int,
              shape: tuple[int, int, int] = SYNTHETIC_SHAPE, name: str = "synthetic",
              ) -> Dataset:
    """Gaussian blobs: x = (mu_y + N(0, I)) / sqrt(1 + signal^2), mu_y ~ N(0, signal^2 I),
    of ``shape``; ``name`` names the dataset and its random streams."""
    if num_train < 1 or num_test < 1:
        raise ValueError(f"synthetic sizes must be >= 1, got train={num_train}, test={num_test}")
    import torch

    dim = int(np.prod(shape))
    means = derive_rng(seed, f"{name}-means").standard_normal(
        (NUM_CLASSES, dim), dtype=np.float32
    ) * np.float32(_SIGNAL)
    norm = np.float32(1.0 / np.sqrt(1.0 + _SIGNAL**2))

    def sample(part: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = derive_rng(seed, f"{name}-samples", part)
        y = rng.integers(0, NUM_CLASSES, size=count, dtype=np.int64)
        x = rng.standard_normal((count, dim), dtype=np.float32)
        x += means[y]
        x *= norm
        return torch.from_numpy(x.reshape(count, *shape)), torch.from_numpy(y)

    train_x, train_y = sample(0, num_train)
    test_x, test_y = sample(1, num_test)
    return Dataset(name, train_x, train_y, test_x, test_y, shape, NUM_CLASSES)


def _load(data_dir: Path | None, seed: int) -> Dataset:
    return synthetic(seed, TRAIN_SAMPLES, TEST_SAMPLES)


def _load_cifar_shaped(data_dir: Path | None, seed: int) -> Dataset:
    return synthetic(seed, TRAIN_SAMPLES, TEST_SAMPLES, CIFAR_SHAPE, "synthetic-cifar")


register_dataset(DatasetSpec(
    "synthetic", "seeded Gaussian blobs, learnable in a few rounds (for tests)",
    SYNTHETIC_SHAPE, NUM_CLASSES, _load))
register_dataset(DatasetSpec(
    "synthetic-cifar", "seeded Gaussian blobs of CIFAR-10's shape, 3x32x32 (benchmarks and "
    "tests of cnn and resnet18)", CIFAR_SHAPE, NUM_CLASSES, _load_cifar_shaped))
