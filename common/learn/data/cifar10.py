"""CIFAR-10: the official python batches (``cifar-10-batches-py/``), read with a restricted
unpickler that resolves only numpy's array-reconstruction globals (never ``pickle.load``)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common.learn.data.base import (
    NUM_CLASSES,
    Dataset,
    DatasetError,
    DatasetSpec,
    register_dataset,
    standardise,
)

if TYPE_CHECKING:
    import torch

_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR_STD = (0.2470, 0.2435, 0.2616)
_CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST_FILE = "test_batch"
_CIFAR_SHAPE = (3, 32, 32)


def _numpy_globals() -> dict[tuple[str, str], object]:
    """The only globals a CIFAR batch may reference: numpy array reconstruction."""
    # (numpy's private helpers: its stubs omit _frombuffer, and mypy takes the numpy < 2
    # names for a second definition)
    try:
        from numpy._core.multiarray import _reconstruct
        from numpy._core.numeric import _frombuffer  # type: ignore[attr-defined]  # unstubbed
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]  # numpy < 2
        from numpy.core.numeric import _frombuffer  # type: ignore[no-redef]  # numpy < 2
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
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DatasetError(f"{path}: labels must lie in 0..{NUM_CLASSES - 1}")
    if labels.shape[0] != data.shape[0]:
        raise DatasetError(f"{path}: {labels.shape[0]} labels for {data.shape[0]} images")
    return data.reshape(-1, *_CIFAR_SHAPE), labels.astype(np.int64)


def _normalise_cifar(images: np.ndarray) -> torch.Tensor:
    per_channel = (1, len(_CIFAR_MEAN), 1, 1)
    return standardise(
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
    import torch

    return Dataset(
        name="cifar10",
        train_x=_normalise_cifar(np.concatenate([images for images, _ in train])),
        train_y=torch.from_numpy(np.concatenate([labels for _, labels in train])),
        test_x=_normalise_cifar(test_images),
        test_y=torch.from_numpy(test_labels),
        input_shape=_CIFAR_SHAPE,
        num_classes=NUM_CLASSES,
    )


def _load(data_dir: Path | None, seed: int) -> Dataset:
    if data_dir is None:
        raise DatasetError(
            "cifar10: pass --data-dir, a directory holding cifar-10-batches-py/ (the "
            "official python version: data_batch_1..5, test_batch)"
        )
    if not data_dir.is_dir():
        raise DatasetError(f"cifar10: data directory {data_dir} does not exist")
    return _load_cifar10(data_dir)


register_dataset(DatasetSpec(
    "cifar10", "CIFAR-10, the official python batches in --data-dir (use --model cnn)",
    _CIFAR_SHAPE, NUM_CLASSES, _load))
