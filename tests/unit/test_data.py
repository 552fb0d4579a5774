"""Unit tests of common/data/: IDX and CIFAR loaders, synthetic data, partitions, batches."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common.data import (
    DatasetError,
    dataset_names,
    load_dataset,
    minibatch_indices,
    partition_indices,
)
from common.data.idx import DEBIAN_FASHION_MNIST_DIR
from common.data.synthetic import synthetic
from common.models import build_model

IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def idx_bytes(array: np.ndarray) -> bytes:
    magic = 0x0800 | array.ndim
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def write_idx_dir(
    directory: Path, gz: bool, n_train: int = 12, n_test: int = 5, side: int = 28
) -> dict[str, np.ndarray]:
    """Write a tiny MNIST-like dataset; returns the raw arrays written."""
    gen = np.random.default_rng(0)
    arrays = {
        "train_images": gen.integers(0, 256, (n_train, side, side), dtype=np.uint8),
        "train_labels": gen.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": gen.integers(0, 256, (n_test, side, side), dtype=np.uint8),
        "test_labels": gen.integers(0, 10, n_test, dtype=np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for key, array in arrays.items():
        data = idx_bytes(array)
        if gz:
            (directory / f"{IDX_NAMES[key]}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / IDX_NAMES[key]).write_bytes(data)
    return arrays


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [False, True])
def test_idx_loader_reads_and_normalises(tmp_path: Path, gz: bool) -> None:
    arrays = write_idx_dir(tmp_path, gz)
    ds = load_dataset("mnist", tmp_path)
    assert ds.name == "mnist" and ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.train_x.dtype == torch.float32
    assert ds.test_x.shape == (5, 1, 28, 28)
    assert ds.train_y.dtype == torch.int64
    np.testing.assert_array_equal(ds.train_y.numpy(), arrays["train_labels"])
    np.testing.assert_array_equal(ds.test_y.numpy(), arrays["test_labels"])
    expected = (arrays["train_images"][:, None] / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(ds.train_x.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_idx_loader_uses_dataset_specific_constants(tmp_path: Path) -> None:
    arrays = write_idx_dir(tmp_path, gz=False)
    ds = load_dataset("fashion-mnist", tmp_path)
    expected = (arrays["test_images"][:, None] / 255.0 - 0.2860) / 0.3530
    np.testing.assert_allclose(ds.test_x.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_idx_loader_takes_image_size_from_header(tmp_path: Path) -> None:
    write_idx_dir(tmp_path, gz=True, side=32)
    assert load_dataset("mnist", tmp_path).input_shape == (1, 32, 32)


def corrupt(directory: Path, key: str, data: bytes) -> Path:
    path = directory / IDX_NAMES[key]
    path.write_bytes(data)
    return path


def test_missing_file_is_named(tmp_path: Path) -> None:
    write_idx_dir(tmp_path, gz=False)
    (tmp_path / IDX_NAMES["test_labels"]).unlink()
    with pytest.raises(DatasetError, match=r"missing t10k-labels-idx1-ubyte \(or .*\.gz\)"):
        load_dataset("mnist", tmp_path)


def test_bad_magic_is_reported(tmp_path: Path) -> None:
    arrays = write_idx_dir(tmp_path, gz=False)
    data = bytearray(idx_bytes(arrays["train_images"]))
    data[3] = 0x01  # claims a 1-D labels file
    path = corrupt(tmp_path, "train_images", bytes(data))
    with pytest.raises(DatasetError, match=rf"{path}: IDX magic 0x00000801, expected 0x00000803"):
        load_dataset("mnist", tmp_path)


def test_truncated_header_is_reported(tmp_path: Path) -> None:
    write_idx_dir(tmp_path, gz=False)
    path = corrupt(tmp_path, "test_images", b"\x00\x00\x08\x03\x00")
    with pytest.raises(DatasetError, match=rf"{path}: truncated IDX header"):
        load_dataset("mnist", tmp_path)


def test_truncated_data_is_reported(tmp_path: Path) -> None:
    arrays = write_idx_dir(tmp_path, gz=False)
    path = corrupt(tmp_path, "train_images", idx_bytes(arrays["train_images"])[:-7])
    with pytest.raises(DatasetError, match=rf"{path}: 9401 data bytes.*need exactly 9408"):
        load_dataset("mnist", tmp_path)


def test_trailing_bytes_are_reported(tmp_path: Path) -> None:
    arrays = write_idx_dir(tmp_path, gz=False)
    path = corrupt(tmp_path, "test_labels", idx_bytes(arrays["test_labels"]) + b"\x00")
    with pytest.raises(DatasetError, match=rf"{path}: 6 data bytes.*need exactly 5"):
        load_dataset("mnist", tmp_path)


def test_label_count_mismatch_is_reported(tmp_path: Path) -> None:
    arrays = write_idx_dir(tmp_path, gz=False)
    path = corrupt(tmp_path, "train_labels", idx_bytes(arrays["train_labels"][:-1]))
    with pytest.raises(DatasetError, match=rf"{path}: 11 labels, but the images file has 12"):
        load_dataset("mnist", tmp_path)


def test_label_out_of_range_is_reported(tmp_path: Path) -> None:
    write_idx_dir(tmp_path, gz=False)
    path = corrupt(tmp_path, "test_labels", idx_bytes(np.array([0, 1, 2, 3, 10], np.uint8)))
    with pytest.raises(DatasetError, match=rf"{path}: label 10 outside 0..9"):
        load_dataset("mnist", tmp_path)


def test_test_image_size_must_match_train(tmp_path: Path) -> None:
    write_idx_dir(tmp_path, gz=False)
    path = corrupt(tmp_path, "test_images", idx_bytes(np.zeros((5, 32, 32), np.uint8)))
    with pytest.raises(DatasetError, match=rf"{path}: images are \(32, 32\)"):
        load_dataset("mnist", tmp_path)


def test_broken_gzip_is_reported(tmp_path: Path) -> None:
    write_idx_dir(tmp_path, gz=True)
    path = tmp_path / f"{IDX_NAMES['train_labels']}.gz"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DatasetError, match=rf"{path}: cannot read"):
        load_dataset("mnist", tmp_path)


def test_mnist_needs_a_data_dir() -> None:
    with pytest.raises(DatasetError, match="mnist: pass --data-dir"):
        load_dataset("mnist")


def test_missing_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset("mnist", tmp_path / "nowhere")


def test_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; valid: cifar10"):
        load_dataset("imagenet")
    assert set(dataset_names()) == {"fashion-mnist", "mnist", "cifar10", "synthetic"}


@pytest.mark.skipif(
    not os.path.isdir(DEBIAN_FASHION_MNIST_DIR),
    reason=f"{DEBIAN_FASHION_MNIST_DIR} absent (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist_from_debian() -> None:
    start = time.perf_counter()
    ds = load_dataset("fashion-mnist")
    elapsed = time.perf_counter() - start
    assert ds.train_x.shape == (60_000, 1, 28, 28) and ds.test_x.shape == (10_000, 1, 28, 28)
    assert ds.train_y.shape == (60_000,) and ds.test_y.shape == (10_000,)
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert abs(ds.train_x.mean().item()) < 0.01 and abs(ds.train_x.std().item() - 1) < 0.01
    assert elapsed < 3.0  # about 0.5 s; generous for loaded CI machines


# --------------------------------------------------------------------------- CIFAR-10


def write_cifar(directory: Path, per_batch: int = 4, protocol: int = 4) -> dict[str, dict]:
    """Official-format python batches (dicts with a uint8 'data' array and 'labels')."""
    gen = np.random.default_rng(1)
    batches = {}
    directory.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": gen.integers(0, 10, per_batch).tolist(),
            b"data": gen.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"img{i}.png".encode() for i in range(per_batch)],
        }
        with (directory / name).open("wb") as f:
            pickle.dump(batch, f, protocol=protocol)
        batches[name] = batch
    return batches


@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize("nested", [True, False])
def test_cifar_loader(tmp_path: Path, nested: bool, protocol: int) -> None:
    batches = write_cifar(
        tmp_path / "cifar-10-batches-py" if nested else tmp_path, protocol=protocol
    )
    ds = load_dataset("cifar10", tmp_path)
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.test_x.shape == (4, 3, 32, 32)
    labels = [y for i in range(1, 6) for y in batches[f"data_batch_{i}"][b"labels"]]
    assert ds.train_y.tolist() == labels and ds.train_y.dtype == torch.int64
    raw = batches["test_batch"][b"data"].reshape(4, 3, 32, 32) / 255.0
    mean = np.array([0.4914, 0.4822, 0.4465]).reshape(1, 3, 1, 1)
    std = np.array([0.2470, 0.2435, 0.2616]).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(ds.test_x.numpy(), (raw - mean) / std, rtol=1e-5, atol=1e-5)


def py2_batch_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """A protocol-2 pickle as Python 2 wrote the official batches (str = bytes, numpy.core)."""

    def string(b: bytes) -> bytes:  # Python 2 str: SHORT_BINSTRING / BINSTRING
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<I", len(b)) + b

    def integer(v: int) -> bytes:  # BININT
        return b"J" + struct.pack("<i", v)

    dtype = (
        b"cnumpy\ndtype\n" + string(b"u1") + integer(0) + integer(1) + b"\x87R"
        + b"(" + integer(3) + string(b"|") + b"NNN" + integer(-1) + integer(-1) + integer(0)
        + b"tb"
    )  # fmt: skip
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        + integer(0) + b"\x85" + string(b"b") + b"\x87R"
        + b"(" + integer(1) + integer(data.shape[0]) + integer(data.shape[1]) + b"\x86"
        + dtype + b"\x89" + string(data.tobytes()) + b"tb"
    )  # fmt: skip
    items = b"".join(integer(v) for v in labels)
    return (
        b"\x80\x02}(" + string(b"data") + array + string(b"labels") + b"](" + items + b"e"
        + string(b"batch_label") + string(b"py2") + b"u."
    )  # fmt: skip


def test_cifar_reads_python2_batches(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    data = np.random.default_rng(0).integers(0, 256, (3, 3072), dtype=np.uint8)
    (tmp_path / "test_batch").write_bytes(py2_batch_pickle(data, [7, 0, 9]))
    ds = load_dataset("cifar10", tmp_path)
    assert ds.test_y.tolist() == [7, 0, 9]
    expected = (data.reshape(3, 3, 32, 32)[:, 1] / 255.0 - 0.4822) / 0.2435
    np.testing.assert_allclose(ds.test_x[:, 1].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_cifar_accepts_str_keys(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    batch = {"data": np.zeros((2, 3072), np.uint8), "labels": [3, 4]}
    (tmp_path / "test_batch").write_bytes(pickle.dumps(batch))
    assert load_dataset("cifar10", tmp_path).test_y.tolist() == [3, 4]


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_cifar_refuses_malicious_pickle(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    marker = tmp_path / "pwned"
    path = tmp_path / "data_batch_3"
    path.write_bytes(pickle.dumps({b"data": _Evil(marker), b"labels": [1]}))
    with pytest.raises(DatasetError, match=rf"{path}: .*refusing global (posix|nt)\.system"):
        load_dataset("cifar10", tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("extra", "refused"),
    [(eval, "builtins.eval"), (np.float64(1.0), r"numpy\.(_core|core)\.multiarray\.scalar")],
    ids=["builtin", "numpy-scalar"],
)
def test_cifar_refuses_other_globals(tmp_path: Path, extra: object, refused: str) -> None:
    write_cifar(tmp_path)
    batch = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [1], b"extra": extra}
    (tmp_path / "test_batch").write_bytes(pickle.dumps(batch))
    with pytest.raises(DatasetError, match=f"refusing global {refused}"):
        load_dataset("cifar10", tmp_path)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ([1, 2, 3], "expected a dict with 'data' and 'labels'"),
        ({b"data": np.zeros((2, 3072), np.uint8)}, "expected a dict"),
        ({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, r"shape \(N, 3072\)"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "uint8"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "1 labels for 2 images"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"0\.\.9"),
    ],
)
def test_cifar_malformed_batches(tmp_path: Path, batch: object, message: str) -> None:
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps(batch))
    with pytest.raises(DatasetError, match=rf"{path}: .*{message}"):
        load_dataset("cifar10", tmp_path)


def test_cifar_truncated_and_missing(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_2"
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(DatasetError, match=rf"{path}: not a CIFAR-10 python batch"):
        load_dataset("cifar10", tmp_path)
    (tmp_path / "test_batch").unlink()
    with pytest.raises(DatasetError, match="missing test_batch"):
        load_dataset("cifar10", tmp_path)
    with pytest.raises(DatasetError, match="cifar10: pass --data-dir"):
        load_dataset("cifar10")


# --------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_and_fast() -> None:
    start = time.perf_counter()
    a = load_dataset("synthetic", seed=3)
    assert time.perf_counter() - start < 1.0  # about 0.03 s
    b = load_dataset("synthetic", seed=3)
    c = load_dataset("synthetic", seed=4)
    assert a.train_x.shape == (2048, 1, 28, 28) and a.test_x.shape == (512, 1, 28, 28)
    assert a.input_shape == (1, 28, 28) and a.num_classes == 10
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)
    assert set(a.train_y.tolist()) == set(range(10))
    small = synthetic(3, 10, 7)
    assert small.train_x.shape[0] == 10 and small.test_y.shape[0] == 7


def test_synthetic_is_learnable_by_the_mlp() -> None:
    ds = load_dataset("synthetic", seed=0)
    model = build_model("mlp", ds.input_shape, ds.num_classes, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (part,) = partition_indices(len(ds.train_y), 1, seed=0)
    for step in range(50):
        idx = torch.from_numpy(minibatch_indices(part, 32, seed=0, worker=0, round=step))
        loss = torch.nn.functional.cross_entropy(model(ds.train_x[idx]), ds.train_y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        accuracy = (model(ds.test_x).argmax(1) == ds.test_y).float().mean().item()
    assert accuracy > 0.5  # chance is 0.1; typically about 0.85


# --------------------------------------------------------------------------- sampling


def test_partition_is_disjoint_covering_and_deterministic() -> None:
    parts = partition_indices(1003, 7, seed=5)
    assert len(parts) == 7
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    joined = np.concatenate(parts)
    assert joined.dtype == np.int64
    np.testing.assert_array_equal(np.sort(joined), np.arange(1003))
    again = partition_indices(1003, 7, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition_indices(1003, 7, seed=6)
    assert not np.array_equal(parts[0], other[0])
    assert not np.array_equal(parts[0], np.sort(parts[0]))  # shuffled, not blocks


def test_partition_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        partition_indices(10, 0, seed=0)
    with pytest.raises(ValueError, match="cannot partition 3 samples over 4 workers"):
        partition_indices(3, 4, seed=0)


def test_minibatch_is_deterministic_per_seed_worker_round() -> None:
    part = partition_indices(6000, 20, seed=0)[3]
    batch = minibatch_indices(part, 32, seed=1, worker=3, round=7)
    assert batch.shape == (32,) and batch.dtype == np.int64
    assert np.isin(batch, part).all()
    assert len(np.unique(batch)) == 32  # without replacement
    np.testing.assert_array_equal(batch, minibatch_indices(part, 32, seed=1, worker=3, round=7))
    for changed in ({"seed": 2}, {"worker": 4}, {"round": 8}):
        kwargs = {"seed": 1, "worker": 3, "round": 7} | changed
        assert not np.array_equal(batch, minibatch_indices(part, 32, **kwargs))


def test_minibatch_from_small_partition_uses_replacement() -> None:
    part = np.array([10, 20, 30])
    batch = minibatch_indices(part, 8, seed=0, worker=0, round=0)
    assert batch.shape == (8,) and set(batch.tolist()) <= {10, 20, 30}
    with pytest.raises(ValueError, match="non-empty"):
        minibatch_indices(np.array([], np.int64), 4, seed=0, worker=0, round=0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        minibatch_indices(part, 0, seed=0, worker=0, round=0)
