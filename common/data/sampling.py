"""Deterministic iid partition of the training set and per-(worker, round) minibatches.

The paper (Xie, Koyejo, Gupta, ICML 2018, Sec. 6) gives each of the n workers an iid
share of the training set and samples minibatches from it; both are derived from the
run seed via :mod:`common.seeding`, so every process draws the same indices.
"""

from __future__ import annotations

import numpy as np

from common.seeding import derive_rng


def partition_indices(num_samples: int, n: int, seed: int) -> list[np.ndarray]:
    """Deterministic iid partition of ``range(num_samples)`` over ``n`` workers.

    A permutation drawn with ``derive_rng(seed, "partition")`` is split into ``n``
    contiguous chunks whose sizes differ by at most one (``np.array_split``): disjoint,
    covering every sample, int64.
    """
    if n < 1:
        raise ValueError(f"need at least one worker, got n={n}")
    if num_samples < n:
        raise ValueError(f"cannot partition {num_samples} samples over {n} workers")
    perm = derive_rng(seed, "partition").permutation(num_samples).astype(np.int64)
    return np.array_split(perm, n)


def minibatch_indices(
    partition: np.ndarray, batch_size: int, seed: int, worker: int, round: int
) -> np.ndarray:
    """``batch_size`` sample indices from ``partition`` for ``worker`` at ``round``.

    Drawn with ``derive_rng(seed, "minibatch", worker, round)``: without replacement when
    the partition holds at least ``batch_size`` samples, otherwise with replacement.
    """
    partition = np.asarray(partition)
    if partition.ndim != 1 or partition.size == 0:
        raise ValueError(f"partition must be a non-empty 1-D index array, got {partition.shape}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rng = derive_rng(seed, "minibatch", worker, round)
    if partition.size >= batch_size:
        picks = rng.choice(partition.size, size=batch_size, replace=False)
    else:
        picks = rng.integers(0, partition.size, size=batch_size)
    return partition[picks].astype(np.int64, copy=False)
