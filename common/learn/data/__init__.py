"""Datasets (one module each, registered by name) and deterministic per-worker sampling.

Every image is scaled to [0, 1] and standardised with fixed per-dataset constants.
Adding a dataset is adding a module that calls :func:`register_dataset`.
"""

from __future__ import annotations

import os
from pathlib import Path

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


_preloaded: dict[tuple[str, Path | None, int], Dataset] = {}


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *,
                 seed: int = 0) -> Dataset:
    """Load dataset ``name`` from ``data_dir`` (``seed``: for generated data), or return
    the one :func:`preload_dataset` kept for these arguments.

    Raises :class:`DatasetError` for missing or malformed files, ``ConfigError`` for an
    unknown name.
    """
    directory = None if data_dir is None else Path(data_dir)
    kept = _preloaded.get((name, directory, seed))
    if kept is not None:
        return kept
    return dataset_spec(name).loader(directory, seed)


def preload_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *,
                    seed: int = 0) -> Dataset:
    """Load ``name`` now and keep it: later :func:`load_dataset` calls with the same
    arguments, here and in the processes forked from here, get this copy (read-only; a
    fork shares its pages instead of decoding the files again)."""
    directory = None if data_dir is None else Path(data_dir)
    dataset = load_dataset(name, directory, seed=seed)
    _preloaded[(name, directory, seed)] = dataset
    return dataset


__all__ = ["DATASETS", "PARTITIONS", "PARTITION_FILE", "Dataset", "DatasetError",
           "DatasetSpec", "class_counts", "dataset_names", "dataset_shape", "dataset_spec",
           "load_dataset", "minibatch_indices", "partition_indices", "preload_dataset",
           "register_dataset", "run_partitions", "write_partition"]
