"""Datasets (MNIST, Fashion-MNIST, CIFAR-10, synthetic) and deterministic per-worker sampling.

* MNIST / Fashion-MNIST: the four IDX files (plain or ``.gz``), parsed with ``np.frombuffer``
  and fully validated. Debian's ``dataset-fashion-mnist`` package installs them as
  ``/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``.
* CIFAR-10: the official python batches (``cifar-10-batches-py/``), read with a restricted
  unpickler that resolves only numpy's array-reconstruction globals (never ``pickle.load``).
* synthetic: class-dependent Gaussian blobs of shape (1, 28, 28), 10 classes, generated from
  the seed in milliseconds; learnable by the MLP within tens of SGD steps.

Every image is scaled to [0, 1] and standardised with fixed per-dataset constants.
The paper (Xie, Koyejo, Gupta, ICML 2018, Sec. 6) gives each of the n workers an iid share
of the training set and samples minibatches from it: :func:`partition_indices`,
:func:`minibatch_indices`, both derived from the run seed via :mod:`common.seeding`.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.typing import ArrayLike

from common.errors import ConfigError
from common.seeding import derive_rng

DATASET_NAMES: tuple[str, ...] = ("fashion-mnist", "mnist", "cifar10", "synthetic")
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# Fixed normalisation constants (mean, std) of the [0, 1]-scaled training images.
_MNIST_STATS = (0.1307, 0.3081)
_FASHION_STATS = (0.2860, 0.3530)
_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR_STD = (0.2470, 0.2435, 0.2616)

_IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_UBYTE = 0x08  # IDX type code of unsigned bytes
_CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST_FILE = "test_batch"
_CIFAR_SHAPE = (3, 32, 32)
_NUM_CLASSES = 10
_SYNTHETIC_SHAPE = (1, 28, 28)
_SYNTHETIC_SIGNAL = 0.25  # per-pixel sd of the class means; the noise has sd 1


class DatasetError(ConfigError):
    """A dataset file is missing or malformed; the message names the file."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A loaded dataset: images (N, C, H, W) float32 standardised, labels int64."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    input_shape: tuple[int, int, int]
    num_classes: int


# --------------------------------------------------------------------------- IDX


def _find_file(directory: Path, base: str) -> Path:
    for candidate in (directory / base, directory / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    raise DatasetError(f"missing {base} (or {base}.gz) in {directory}")


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if path.suffix == ".gz" else raw
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from exc


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """The unsigned-byte IDX array in ``path`` (magic 0x0000080<ndim>), shaped by its header."""
    raw = _read_bytes(path)
    what = "images" if ndim == 3 else "labels"
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(
            f"{path}: truncated IDX header ({len(raw)} bytes, need {header} for {what})"
        )
    magic = struct.unpack(">I", raw[:4])[0]
    expected = (_IDX_UBYTE << 8) | ndim
    if magic != expected:
        raise DatasetError(
            f"{path}: IDX magic 0x{magic:08x}, expected 0x{expected:08x} "
            f"(unsigned-byte {what}, {ndim} dimension(s))"
        )
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    size = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != size:
        raise DatasetError(
            f"{path}: {len(raw) - header} data bytes, but the header's dimensions {dims} "
            f"need exactly {size}"
        )
    return np.frombuffer(raw, dtype=np.uint8, count=size, offset=header).reshape(dims)


def _standardise(images: np.ndarray, mean: ArrayLike, std: ArrayLike) -> torch.Tensor:
    """Bytes -> float32 ``(b / 255 - mean) / std`` (as one multiply-add; ``mean`` and ``std``
    broadcast against ``images``, e.g. per channel)."""
    mean = np.asarray(mean, dtype=np.float64)
    std = np.asarray(std, dtype=np.float64)
    x = images.astype(np.float32)
    x *= (1.0 / (255.0 * std)).astype(np.float32)
    x += (-mean / std).astype(np.float32)
    return torch.from_numpy(x)


def _check_labels(path: Path, labels: np.ndarray, count: int) -> np.ndarray:
    if labels.shape[0] != count:
        raise DatasetError(f"{path}: {labels.shape[0]} labels, but the images file has {count}")
    if labels.size and int(labels.max()) >= _NUM_CLASSES:
        raise DatasetError(f"{path}: label {int(labels.max())} outside 0..{_NUM_CLASSES - 1}")
    return labels.astype(np.int64)


def _read_idx_split(
    images_path: Path, labels_path: Path, stats: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised images (N, 1, H, W) and int64 labels of one split."""
    images = _read_idx(images_path, 3)
    labels = _check_labels(labels_path, _read_idx(labels_path, 1), images.shape[0])
    x = _standardise(images.reshape(images.shape[0], 1, *images.shape[1:]), *stats)
    return x, torch.from_numpy(labels)


def _load_idx_dataset(name: str, directory: Path, stats: tuple[float, float]) -> Dataset:
    if not directory.is_dir():
        raise DatasetError(f"{name}: data directory {directory} does not exist")
    paths = {key: _find_file(directory, base) for key, base in _IDX_FILES.items()}
    train_x, train_y = _read_idx_split(paths["train_images"], paths["train_labels"], stats)
    test_x, test_y = _read_idx_split(paths["test_images"], paths["test_labels"], stats)
    if test_x.shape[1:] != train_x.shape[1:]:
        raise DatasetError(
            f"{paths['test_images']}: images are {tuple(test_x.shape[2:])}, "
            f"the training images are {tuple(train_x.shape[2:])}"
        )
    c, h, w = train_x.shape[1:]
    return Dataset(name, train_x, train_y, test_x, test_y, (c, h, w), _NUM_CLASSES)


# --------------------------------------------------------------------------- CIFAR-10


def _numpy_globals() -> dict[tuple[str, str], object]:
    """The only globals a CIFAR batch may reference: numpy array reconstruction."""
    try:
        from numpy._core.multiarray import _reconstruct
        from numpy._core.numeric import _frombuffer
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
        from numpy.core.numeric import _frombuffer
    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for package in ("numpy.core", "numpy._core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = _reconstruct
        # pickle protocol 5 (Python >= 3.14's default) rebuilds arrays with _frombuffer
        allowed[(f"{package}.numeric", "_frombuffer")] = _frombuffer
    return allowed


_CIFAR_GLOBALS = _numpy_globals()


class _CifarUnpickler(pickle.Unpickler):
    """Resolves numpy's array-reconstruction globals and refuses every other one."""

    def find_class(self, module: str, name: str) -> object:
        try:
            return _CIFAR_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing global {module}.{name} (only numpy arrays are allowed)"
            ) from None


def _field(batch: dict, key: str) -> object:
    for k in (key, key.encode()):
        if k in batch:
            return batch[k]
    raise KeyError(key)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images (N, 3, 32, 32), int64 labels (N,)) of one official python batch."""
    try:
        with path.open("rb") as f:
            batch = _CifarUnpickler(f, encoding="bytes").load()
    except Exception as exc:  # any malformed or hostile pickle is a dataset error
        raise DatasetError(f"{path}: not a CIFAR-10 python batch: {exc}") from exc
    try:
        data = _field(batch, "data")
        labels = np.asarray(_field(batch, "labels"))
    except (KeyError, TypeError) as exc:
        raise DatasetError(
            f"{path}: expected a dict with 'data' and 'labels', got {type(batch).__name__} "
            f"without {exc}"
        ) from exc
    pixels = int(np.prod(_CIFAR_SHAPE))
    if not (
        isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and data.ndim == 2
        and data.shape[1] == pixels
    ):
        raise DatasetError(
            f"{path}: 'data' must be a uint8 array of shape (N, {pixels}), got "
            f"{type(data).__name__} {getattr(data, 'dtype', '')} {getattr(data, 'shape', '')}"
        )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{path}: 'labels' must be a list of ints")
    if labels.size and (labels.min() < 0 or labels.max() >= _NUM_CLASSES):
        raise DatasetError(f"{path}: labels must lie in 0..{_NUM_CLASSES - 1}")
    if labels.shape[0] != data.shape[0]:
        raise DatasetError(f"{path}: {labels.shape[0]} labels for {data.shape[0]} images")
    return data.reshape(-1, *_CIFAR_SHAPE), labels.astype(np.int64)


def _normalise_cifar(images: np.ndarray) -> torch.Tensor:
    per_channel = (1, len(_CIFAR_MEAN), 1, 1)
    return _standardise(
        images, np.reshape(_CIFAR_MEAN, per_channel), np.reshape(_CIFAR_STD, per_channel)
    )


def _load_cifar10(directory: Path) -> Dataset:
    nested = directory / "cifar-10-batches-py"
    base = nested if nested.is_dir() else directory
    missing = [f for f in (*_CIFAR_TRAIN_FILES, _CIFAR_TEST_FILE) if not (base / f).is_file()]
    if missing:
        raise DatasetError(
            f"cifar10: missing {', '.join(missing)} in {base} (expected the official python "
            "batches data_batch_1..5 and test_batch, or their folder cifar-10-batches-py)"
        )
    train = [_read_cifar_batch(base / f) for f in _CIFAR_TRAIN_FILES]
    test_images, test_labels = _read_cifar_batch(base / _CIFAR_TEST_FILE)
    return Dataset(
        name="cifar10",
        train_x=_normalise_cifar(np.concatenate([images for images, _ in train])),
        train_y=torch.from_numpy(np.concatenate([labels for _, labels in train])),
        test_x=_normalise_cifar(test_images),
        test_y=torch.from_numpy(test_labels),
        input_shape=_CIFAR_SHAPE,
        num_classes=_NUM_CLASSES,
    )


# --------------------------------------------------------------------------- synthetic


def _synthetic(seed: int, num_train: int, num_test: int) -> Dataset:
    """Gaussian blobs: x = (mu_y + N(0, I)) / sqrt(1 + signal^2), mu_y ~ N(0, signal^2 I)."""
    if num_train < 1 or num_test < 1:
        raise ValueError(f"synthetic sizes must be >= 1, got train={num_train}, test={num_test}")
    dim = int(np.prod(_SYNTHETIC_SHAPE))
    means = derive_rng(seed, "synthetic-means").standard_normal(
        (_NUM_CLASSES, dim), dtype=np.float32
    ) * np.float32(_SYNTHETIC_SIGNAL)
    norm = np.float32(1.0 / np.sqrt(1.0 + _SYNTHETIC_SIGNAL**2))

    def sample(part: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = derive_rng(seed, "synthetic-samples", part)
        y = rng.integers(0, _NUM_CLASSES, size=count, dtype=np.int64)
        x = rng.standard_normal((count, dim), dtype=np.float32)
        x += means[y]
        x *= norm
        return torch.from_numpy(x.reshape(count, *_SYNTHETIC_SHAPE)), torch.from_numpy(y)

    train_x, train_y = sample(0, num_train)
    test_x, test_y = sample(1, num_test)
    return Dataset("synthetic", train_x, train_y, test_x, test_y, _SYNTHETIC_SHAPE, _NUM_CLASSES)


# --------------------------------------------------------------------------- public API


def dataset_shape(name: str) -> tuple[tuple[int, int, int], int]:
    """(input shape (C, H, W), number of classes) of dataset ``name``, without loading it."""
    shapes = {
        "fashion-mnist": ((1, 28, 28), _NUM_CLASSES),
        "mnist": ((1, 28, 28), _NUM_CLASSES),
        "cifar10": (_CIFAR_SHAPE, _NUM_CLASSES),
        "synthetic": (_SYNTHETIC_SHAPE, _NUM_CLASSES),
    }
    if name not in shapes:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    return shapes[name]


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    synthetic_train: int = 2048,
    synthetic_test: int = 512,
) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASET_NAMES`).

    ``data_dir`` holds the files (for "fashion-mnist" it defaults to Debian's
    :data:`DEBIAN_FASHION_MNIST_DIR`); ``seed`` and the sizes apply to "synthetic" only.
    Raises :class:`DatasetError` for missing or malformed files, ValueError for an unknown
    name.
    """
    if name == "synthetic":
        return _synthetic(seed, synthetic_train, synthetic_test)
    if name == "fashion-mnist":
        if data_dir is None:
            if not Path(DEBIAN_FASHION_MNIST_DIR).is_dir():
                raise DatasetError(
                    f"fashion-mnist: {DEBIAN_FASHION_MNIST_DIR} does not exist; install "
                    "Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) "
                    "or pass --data-dir"
                )
            data_dir = DEBIAN_FASHION_MNIST_DIR
        return _load_idx_dataset(name, Path(data_dir), _FASHION_STATS)
    if name == "mnist":
        if data_dir is None:
            raise DatasetError(
                "mnist: pass --data-dir, a directory holding train-images-idx3-ubyte, "
                "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
                "(each optionally .gz)"
            )
        return _load_idx_dataset(name, Path(data_dir), _MNIST_STATS)
    if name == "cifar10":
        if data_dir is None:
            raise DatasetError(
                "cifar10: pass --data-dir, a directory holding cifar-10-batches-py/ (the "
                "official python version: data_batch_1..5, test_batch)"
            )
        directory = Path(data_dir)
        if not directory.is_dir():
            raise DatasetError(f"cifar10: data directory {directory} does not exist")
        return _load_cifar10(directory)
    raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASET_NAMES)}")


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
