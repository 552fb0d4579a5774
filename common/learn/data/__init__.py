"""Datasets (one module each, registered by name) and deterministic per-worker sampling.

Every image is scaled to [0, 1] and standardised with fixed per-dataset constants.
Adding a dataset is adding a module that calls :func:`register_dataset`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

# The catalogue: every built-in dataset family, a module each, which registers it
# when imported (``ps-list`` shows the registry, in the order of their first import).
from common.learn.data import (
    cifar10,
    idx,
    mnist5k,
    synthetic,
)
from common.learn.data.base import (
    DATASETS,
    Dataset,
    DatasetError,
    DatasetSpec,
    dataset_names,
    register_dataset,
)
from common.learn.data.sampling import (
    PARTITION_FILE,
    PARTITIONS,
    class_counts,
    minibatch_indices,
    partition_indices,
    run_partitions,
    write_partition,
)
from common.learn.data.validation import hold_out

if TYPE_CHECKING:
    from common.run.config import RunConfig

CATALOGUE = (
    cifar10, idx, mnist5k, synthetic,
)


def dataset_spec(name: str) -> DatasetSpec:
    """The dataset called ``name``; ``ConfigError`` listing the valid names."""
    return DATASETS[name]


def dataset_shape(name: str) -> tuple[tuple[int, int, int], int]:
    """(input shape (C, H, W), number of classes) of dataset ``name``, without loading it."""
    spec = dataset_spec(name)
    return spec.input_shape, spec.num_classes


_preloaded: dict[tuple[str, Path | None, int, float], Dataset] = {}


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *,
                 seed: int = 0, validation: float = 0.0) -> Dataset:
    """Load dataset ``name`` from ``data_dir`` (``seed``: for generated data), with
    ``validation`` > 0 that share of its training set held out as its evaluation set
    (:func:`~common.learn.data.validation.hold_out`), or return the one
    :func:`preload_dataset` kept for these arguments. A run's processes call
    :func:`run_dataset`.

    Raises :class:`DatasetError` for missing or malformed files, ``ConfigError`` for an
    unknown name or a split it cannot make.
    """
    directory = None if data_dir is None else Path(data_dir)
    kept = _preloaded.get((name, directory, seed, validation))
    if kept is not None:
        return kept
    if validation:
        return hold_out(load_dataset(name, directory, seed=seed), validation)
    return dataset_spec(name).loader(directory, seed)


def run_dataset(cfg: RunConfig, data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """The dataset of run ``cfg`` as each of its processes (workers, evaluator, launcher,
    reference engine) sees it: its training set less ``--validation``'s held-out part,
    which is then its evaluation set in place of the test set."""
    return load_dataset(cfg.dataset, data_dir, seed=cfg.seed, validation=cfg.validation)


def preload_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *,
                    seed: int = 0, validation: float = 0.0) -> Dataset:
    """Load ``name`` now and keep it: later :func:`load_dataset` calls with the same
    arguments, here and in the processes forked from here, get this copy (read-only; a
    fork shares its pages instead of decoding the files again)."""
    directory = None if data_dir is None else Path(data_dir)
    dataset = load_dataset(name, directory, seed=seed, validation=validation)
    _preloaded[(name, directory, seed, validation)] = dataset
    return dataset


__all__ = ["DATASETS", "PARTITIONS", "PARTITION_FILE", "Dataset", "DatasetError",
           "DatasetSpec", "class_counts", "dataset_names", "dataset_shape", "dataset_spec",
           "load_dataset", "minibatch_indices", "partition_indices", "preload_dataset",
           "register_dataset", "run_dataset", "run_partitions", "write_partition"]
