"""``--validation``: a stratified part of the training set held out as a run's evaluation set.

A setting tuned on the test set is then judged by the data it was chosen on. With
``--validation f`` each class gives ``round(f * count)`` of its training samples (half
up) to the evaluation set, which replaces the test set; the workers' partitions are made
over the rest, so no worker trains on a held-out sample.

The split depends on the training labels and ``f`` alone, drawn from streams of a fixed
seed, :data:`SPLIT_SEED`, never the run's: every seed of a tuning grid is judged on the
same samples, so its seeds differ by training alone and pair with each other. (A
generated dataset, ``synthetic``, is itself drawn from the run seed, and so is its split.)
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from common.errors import ConfigError
from common.learn.seeding import derive_rng

if TYPE_CHECKING:
    from common.learn.data.base import Dataset

SPLIT_SEED = 0  # the split's streams are named "validation": none of a run's streams


def validation_split(labels: np.ndarray, fraction: float, num_classes: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held): the indices of ``labels`` left for training, ascending, and those
    held out, shuffled (so that a prefix, ``--eval-samples``, is a random subset). Class k
    holds out ``round(fraction * count_k)`` samples drawn with ``derive_rng(SPLIT_SEED,
    "validation", k)``; ``ConfigError`` for a fraction outside (0, 1) or a class that would
    hold out none or keep none."""
    if not 0 < fraction < 1:
        raise ConfigError(f"--validation must be in (0, 1) to hold out part of the training "
                          f"set, got {fraction:g}")
    labels = np.asarray(labels)
    held = []
    for k in range(num_classes):
        members = np.flatnonzero(labels == k)
        if members.size == 0:
            continue
        take = math.floor(fraction * members.size + 0.5)
        if not 0 < take < members.size:
            raise ConfigError(
                f"--validation {fraction:g} of class {k}'s {members.size} training samples "
                f"holds out {take}: each class needs at least one sample on each side; use "
                f"a fraction between {0.5 / members.size:.3g} and "
                f"{1 - 0.5 / members.size:.3g}")
        held.append(derive_rng(SPLIT_SEED, "validation", k).choice(members, take,
                                                                     replace=False))
    out = np.concatenate(held).astype(np.int64) if held else np.empty(0, np.int64)
    kept = np.setdiff1d(np.arange(labels.size, dtype=np.int64), out, assume_unique=True)
    return kept, derive_rng(SPLIT_SEED, "validation-order").permutation(out)


def hold_out(dataset: Dataset, fraction: float) -> Dataset:
    """``dataset`` with :func:`validation_split`'s held-out part of its training set as its
    evaluation set (``test_x``, ``test_y``) and the rest as its training set."""
    import torch

    kept, held = (torch.from_numpy(i) for i in validation_split(
        dataset.train_y.numpy(), fraction, dataset.num_classes))
    return dataclasses.replace(
        dataset, train_x=dataset.train_x[kept], train_y=dataset.train_y[kept],
        test_x=dataset.train_x[held], test_y=dataset.train_y[held], validation=fraction)


def check_split(dataset: Dataset, validation: float) -> None:
    """``ValueError`` unless ``dataset`` holds out the run's ``--validation`` share (a
    run's processes build it with ``run_dataset``, or they would train or evaluate on
    other samples than each other)."""
    if dataset.validation != validation:
        raise ValueError(f"the dataset holds out {dataset.validation:g} of its training set, "
                         f"the run --validation {validation:g}: load it with run_dataset")
