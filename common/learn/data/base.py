"""What every dataset shares: the loaded form, its errors, the registry of datasets.

A dataset module registers a :class:`DatasetSpec`: its name, the shape of one input,
the number of classes, a one-line summary and a loader. The registry is light (no
torch): launchers list and validate datasets without loading one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from common.conf.registry import Registry
from common.errors import ConfigError

if TYPE_CHECKING:
    import torch

NUM_CLASSES = 10


class DatasetError(ConfigError):
    """A dataset file is missing or malformed; the message names the file."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A loaded dataset: images (N, C, H, W) float32 standardised, labels int64; the
    evaluation set is the test set, or with ``validation`` > 0 that share of the training
    set held out (``common.learn.data.validation``)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    input_shape: tuple[int, int, int]
    num_classes: int
    validation: float = 0.0

    @property
    def evaluated_on(self) -> str:
        """What ``test_x`` holds: ``"test"`` or ``"validation"``."""
        return "validation" if self.validation else "test"


# (data_dir or None, seed) -> Dataset
Loader = Callable[[Path | None, int], Dataset]


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: what it is and how to load it."""

    name: str
    summary: str
    input_shape: tuple[int, int, int]
    num_classes: int
    loader: Loader


DATASETS: Registry[DatasetSpec] = Registry("dataset", ConfigError)
"""Every dataset by name, in registration order."""

register_dataset = DATASETS.register
"""Add a :class:`DatasetSpec` to :data:`DATASETS` under its ``name``."""


def dataset_names() -> tuple[str, ...]:
    return tuple(DATASETS)


def standardise(images: np.ndarray, mean: ArrayLike, std: ArrayLike) -> torch.Tensor:
    """Bytes -> float32 ``(b / 255 - mean) / std`` (as one multiply-add; ``mean`` and ``std``
    broadcast against ``images``, e.g. per channel)."""
    import torch

    mean = np.asarray(mean, dtype=np.float64)
    std = np.asarray(std, dtype=np.float64)
    x = images.astype(np.float32)
    x *= (1.0 / (255.0 * std)).astype(np.float32)
    x += (-mean / std).astype(np.float32)
    return torch.from_numpy(x)
