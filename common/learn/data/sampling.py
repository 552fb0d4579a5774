"""Deterministic partitions of the training set and per-(worker, round) minibatches.

The paper (Xie, Koyejo, Gupta, ICML 2018, Sec. 6) gives each of the n workers an iid
share of the training set and samples minibatches from it (``--partition iid``). The
heterogeneous partitions are ByzFL's (Allouah et al., LPD-EPFL/byzfl,
``fed_framework/data_distributor.py``): ``dirichlet`` (``dirichlet_niid``), ``extreme``
(``extreme_niid``) and ``gamma`` (``gamma_similarity_niid``). By default all n workers
get a part of the split, as with iid. ByzFL shares the data among the honest clients
only: ``--iid-workers`` (the Byzantine ones) take an iid share instead, and the split is
made over the others, so that a Byzantine worker's part is not data the honest workers
lack (under ``extreme``, whole classes).

Everything random is derived from the run seed via :mod:`common.learn.seeding`, so every
process (each worker, the reference engine, the launcher writing ``partition.json``)
computes the same indices.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.errors import ConfigError
from common.learn.data.validation import check_split
from common.learn.seeding import derive_rng

if TYPE_CHECKING:
    from common.learn.data.base import Dataset
    from common.run.config import RunConfig

PARTITIONS = ("iid", "dirichlet", "extreme", "gamma")  # --partition, in --help order
PARTITION_FILE = "partition.json"  # each worker's class counts, in a run's output directory


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


def extreme_partition(labels: np.ndarray, n: int) -> list[np.ndarray]:
    """ByzFL's ``extreme_niid``: the samples sorted by (label, index), split into ``n``
    contiguous chunks whose sizes differ by at most one. Each worker sees one class or
    the two at a boundary (with 10 classes and n >= 10); no randomness."""
    labels = np.asarray(labels)
    _check_sizes(labels.size, n)
    return np.array_split(np.argsort(labels, kind="stable").astype(np.int64), n)


def dirichlet_partition(labels: np.ndarray, n: int, alpha: float, seed: int,
                        num_classes: int) -> list[np.ndarray]:
    """ByzFL's ``dirichlet_niid``: for each class k, proportions p_k ~ Dir(alpha 1_n) over
    the workers (one (num_classes, n) draw from ``derive_rng(seed, "partition",
    "partition-dirichlet")``); the samples of class k, in index order, are cut at
    ``floor(cumsum(p_k) * count_k)`` and worker j gets the j-th piece of every class (in
    class order). Every sample goes to exactly one worker; a small ``alpha`` gives each
    worker few classes, a large one approaches iid proportions."""
    labels = np.asarray(labels)
    _check_sizes(labels.size, n)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    shares = derive_rng(seed, "partition-dirichlet").dirichlet(
        np.full(n, float(alpha)), size=num_classes)
    pieces: list[list[np.ndarray]] = [[] for _ in range(n)]
    for k in range(num_classes):
        members = np.flatnonzero(labels == k).astype(np.int64)
        cuts = (np.cumsum(shares[k])[:-1] * members.size).astype(np.int64)
        for j, piece in enumerate(np.split(members, cuts)):
            pieces[j].append(piece)
    return [np.concatenate(p) if p else np.empty(0, np.int64) for p in pieces]


def gamma_partition(labels: np.ndarray, n: int, gamma: float, seed: int) -> list[np.ndarray]:
    """ByzFL's ``gamma_similarity_niid``: the first ``int(gamma * N)`` samples are shared
    out iid (shuffled, then split as :func:`partition_indices`), the others as
    :func:`extreme_partition`; worker i gets its iid share followed by its extreme one.
    ``gamma = 1`` is exactly the iid partition of the same seed, ``gamma = 0`` the
    extreme one."""
    labels = np.asarray(labels)
    _check_sizes(labels.size, n)
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    similar = int(labels.size * gamma)
    iid = np.array_split(
        derive_rng(seed, "partition").permutation(similar).astype(np.int64), n)
    rest = np.arange(similar, labels.size, dtype=np.int64)
    extreme = np.array_split(rest[np.argsort(labels[similar:], kind="stable")], n)
    return [np.concatenate((a, b)) for a, b in zip(iid, extreme, strict=True)]


def _check_sizes(num_samples: int, n: int) -> None:
    if n < 1:
        raise ValueError(f"need at least one worker, got n={n}")
    if num_samples < n:
        raise ValueError(f"cannot partition {num_samples} samples over {n} workers")


def run_partitions(cfg: RunConfig, dataset: Dataset) -> list[np.ndarray]:
    """Each worker's sample indices under ``cfg``'s ``--partition`` (with its ``--alpha``
    or ``--gamma``), the split made over the workers not in ``--iid-workers``, each of
    those taking its share of the iid partition of the same seed; ``ConfigError`` naming
    the first worker left with fewer samples than one batch (it could not draw a
    minibatch without repeating samples); ``ValueError`` for a dataset not built for
    ``cfg``'s ``--validation`` (``run_dataset``)."""
    check_split(dataset, cfg.validation)
    labels = dataset.train_y.numpy()
    n = cfg.num_workers
    spared = set(cfg.iid_workers) if cfg.partition != "iid" else set()
    iid = partition_indices(labels.size, n, cfg.seed) if cfg.partition == "iid" or spared \
        else []
    split_over = [w for w in range(n) if w not in spared]
    k = len(split_over)
    partitions: dict[str, Callable[[], list[np.ndarray]]] = {
        "iid": lambda: iid,
        "dirichlet": lambda: dirichlet_partition(labels, k, cfg.alpha, cfg.seed,
                                                 dataset.num_classes),
        "extreme": lambda: extreme_partition(labels, k),
        "gamma": lambda: gamma_partition(labels, k, cfg.gamma, cfg.seed),
    }
    split = dict(zip(split_over, partitions[cfg.partition](), strict=True))
    parts = [split[w] if w in split else iid[w] for w in range(n)]
    for worker, part in enumerate(parts):
        if part.size < cfg.batch_size:
            raise ConfigError(
                f"{describe(cfg)} leaves worker {worker} with {part.size} training samples, "
                f"fewer than one batch (--batch-size {cfg.batch_size}); use another --seed, "
                f"fewer --workers, a smaller --batch-size or a milder partition")
    return parts


def describe(cfg: RunConfig) -> str:
    """``--partition dirichlet --alpha 0.1`` (the partition's own parameter only)."""
    extra = {"dirichlet": f" --alpha {cfg.alpha:g}", "gamma": f" --gamma {cfg.gamma:g}"}
    spared = (f" --iid-workers {','.join(map(str, cfg.iid_workers))}"
              if cfg.iid_workers and cfg.partition != "iid" else "")
    return f"--partition {cfg.partition}{extra.get(cfg.partition, '')}{spared}"


def class_counts(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(n, num_classes) int64: how many samples of each class each worker holds."""
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]
                    ).astype(np.int64)


def write_partition(out_dir: Path, cfg: RunConfig, dataset: Dataset) -> Path:
    """Compute the run's partition (``ConfigError`` as :func:`run_partitions`) and write
    each worker's class counts to ``out_dir/partition.json``."""
    parts = run_partitions(cfg, dataset)
    labels = dataset.train_y.numpy()
    record: dict[str, Any] = {
        "partition": cfg.partition, "alpha": cfg.alpha, "gamma": cfg.gamma,
        "iid_workers": list(cfg.iid_workers),
        "seed": cfg.seed, "dataset": cfg.dataset, "batch_size": cfg.batch_size,
        "counts": class_counts(parts, labels, dataset.num_classes).tolist(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PARTITION_FILE
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return path


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
