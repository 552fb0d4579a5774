"""MNIST and Fashion-MNIST: the four IDX files (plain or ``.gz``), parsed with
``np.frombuffer`` and fully validated.

Debian's ``dataset-fashion-mnist`` package installs Fashion-MNIST as
``/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``;
it is the default dataset and needs no ``--data-dir``.
"""

from __future__ import annotations

import gzip
import struct
import zlib
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

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
SHAPE = (1, 28, 28)

# Fixed normalisation constants (mean, std) of the [0, 1]-scaled training images.
MNIST_STATS = (0.1307, 0.3081)
_FASHION_STATS = (0.2860, 0.3530)

_IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_UBYTE = 0x08  # IDX type code of unsigned bytes


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


def _check_labels(path: Path, labels: np.ndarray, count: int) -> np.ndarray:
    if labels.shape[0] != count:
        raise DatasetError(f"{path}: {labels.shape[0]} labels, but the images file has {count}")
    if labels.size and int(labels.max()) >= NUM_CLASSES:
        raise DatasetError(f"{path}: label {int(labels.max())} outside 0..{NUM_CLASSES - 1}")
    return labels.astype(np.int64)


def _read_idx_split(
    images_path: Path, labels_path: Path, stats: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised images (N, 1, H, W) and int64 labels of one split."""
    images = _read_idx(images_path, 3)
    labels = _check_labels(labels_path, _read_idx(labels_path, 1), images.shape[0])
    x = standardise(images.reshape(images.shape[0], 1, *images.shape[1:]), *stats)
    import torch

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
    return Dataset(name, train_x, train_y, test_x, test_y, (c, h, w), NUM_CLASSES)


def _load_fashion_mnist(data_dir: Path | None, seed: int) -> Dataset:
    if data_dir is None:
        if not Path(DEBIAN_FASHION_MNIST_DIR).is_dir():
            raise DatasetError(
                f"fashion-mnist: {DEBIAN_FASHION_MNIST_DIR} does not exist; install "
                "Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) "
                "or pass --data-dir"
            )
        data_dir = Path(DEBIAN_FASHION_MNIST_DIR)
    return _load_idx_dataset("fashion-mnist", data_dir, _FASHION_STATS)


def _load_mnist(data_dir: Path | None, seed: int) -> Dataset:
    if data_dir is None:
        raise DatasetError(
            "mnist: pass --data-dir, a directory holding train-images-idx3-ubyte, "
            "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
            "(each optionally .gz)"
        )
    return _load_idx_dataset("mnist", data_dir, MNIST_STATS)


register_dataset(DatasetSpec(
    "fashion-mnist", "Fashion-MNIST, IDX files; default: Debian's "
    "/usr/share/datasets/fashion-mnist", SHAPE, NUM_CLASSES, _load_fashion_mnist))
register_dataset(DatasetSpec(
    "mnist", "MNIST, the four IDX files (gz or not) in --data-dir", SHAPE, NUM_CLASSES,
    _load_mnist))
