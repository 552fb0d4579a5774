"""Synthetic data: class-dependent Gaussian blobs of shape (1, 28, 28), 10 classes,
generated from the seed in milliseconds; learnable by the MLP within tens of SGD steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.data.base import NUM_CLASSES, Dataset, DatasetSpec, register_dataset
from common.seeding import derive_rng

SYNTHETIC_SHAPE = (1, 28, 28)
TRAIN_SAMPLES = 2048
TEST_SAMPLES = 512
_SIGNAL = 0.25  # per-pixel sd of the class means; the noise has sd 1


def synthetic(seed: int, num_train: int, num_test: int) -> Dataset:
    """Gaussian blobs: x = (mu_y + N(0, I)) / sqrt(1 + signal^2), mu_y ~ N(0, signal^2 I)."""
    if num_train < 1 or num_test < 1:
        raise ValueError(f"synthetic sizes must be >= 1, got train={num_train}, test={num_test}")
    import torch

    dim = int(np.prod(SYNTHETIC_SHAPE))
    means = derive_rng(seed, "synthetic-means").standard_normal(
        (NUM_CLASSES, dim), dtype=np.float32
    ) * np.float32(_SIGNAL)
    norm = np.float32(1.0 / np.sqrt(1.0 + _SIGNAL**2))

    def sample(part: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = derive_rng(seed, "synthetic-samples", part)
        y = rng.integers(0, NUM_CLASSES, size=count, dtype=np.int64)
        x = rng.standard_normal((count, dim), dtype=np.float32)
        x += means[y]
        x *= norm
        return torch.from_numpy(x.reshape(count, *SYNTHETIC_SHAPE)), torch.from_numpy(y)

    train_x, train_y = sample(0, num_train)
    test_x, test_y = sample(1, num_test)
    return Dataset("synthetic", train_x, train_y, test_x, test_y, SYNTHETIC_SHAPE, NUM_CLASSES)


def _load(data_dir: Path | None, seed: int) -> Dataset:
    return synthetic(seed, TRAIN_SAMPLES, TEST_SAMPLES)


register_dataset(DatasetSpec(
    "synthetic", "seeded Gaussian blobs, learnable in a few rounds (for tests)",
    SYNTHETIC_SHAPE, NUM_CLASSES, _load))
