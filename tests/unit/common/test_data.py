"""Unit tests of common/learn/data/: IDX and CIFAR loaders, synthetic data, partitions, batches."""

from __future__ import annotations

import gzip
import os
import pickle
import re
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import ConfigError
from common.learn.data import (
    PARTITION_FILE,
    DatasetError,
    class_counts,
    dataset_names,
    load_dataset,
    minibatch_indices,
    partition_indices,
    run_partitions,
    write_partition,
)
from common.learn.data.idx import DEBIAN_FASHION_MNIST_DIR
from common.learn.data.sampling import dirichlet_partition, extreme_partition, gamma_partition
from common.learn.data.synthetic import synthetic
from common.learn.models import build_model
from common.run.config import RunConfig

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
    assert set(dataset_names()) == {"fashion-mnist", "mnist", "mnist-5k", "cifar10",
                                    "synthetic", "synthetic-cifar"}


@pytest.mark.skipif(
    not os.path.isdir(DEBIAN_FASHION_MNIST_DIR),
    reason=f"{DEBIAN_FASHION_MNIST_DIR} absent (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist_from_debian() -> None:
    ds = load_dataset("fashion-mnist")  # (its load time is a benchmark's, not a test's)
    assert ds.train_x.shape == (60_000, 1, 28, 28) and ds.test_x.shape == (10_000, 1, 28, 28)
    assert ds.train_y.shape == (60_000,) and ds.test_y.shape == (10_000,)
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert abs(ds.train_x.mean().item()) < 0.01 and abs(ds.train_x.std().item() - 1) < 0.01


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


def test_synthetic_cifar_has_cifar_s_shape_and_streams_of_its_own() -> None:
    a = load_dataset("synthetic-cifar", seed=3)
    assert a.name == "synthetic-cifar" and a.input_shape == (3, 32, 32)
    assert a.train_x.shape == (2048, 3, 32, 32) and a.test_x.shape == (512, 3, 32, 32)
    assert torch.equal(a.train_x, load_dataset("synthetic-cifar", seed=3).train_x)
    plain = load_dataset("synthetic", seed=3)  # its own streams: not the 28x28 labels
    assert not torch.equal(a.train_y, plain.train_y)
    assert set(a.train_y.tolist()) == set(range(10))


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


# 3000 samples of 10 classes in a random order, a few more of class 0
LABELS = np.random.default_rng(11).permutation(np.r_[np.repeat(np.arange(10), 295),
                                                     np.zeros(50, np.int64)])


def _assert_each_sample_once(parts: list[np.ndarray], total: int) -> None:
    joined = np.concatenate(parts)
    assert joined.dtype == np.int64
    np.testing.assert_array_equal(np.sort(joined), np.arange(total))


def _classes_held(parts: list[np.ndarray]) -> list[int]:
    return [int((row > 0).sum()) for row in class_counts(parts, LABELS, 10)]


def test_extreme_partition_sorts_by_label_then_splits() -> None:
    parts = extreme_partition(LABELS, 10)
    _assert_each_sample_once(parts, LABELS.size)
    assert [p.size for p in parts] == [300] * 10  # np.array_split sizes
    assert max(_classes_held(parts)) <= 2  # one class, or the two at a boundary
    for p in parts:  # by label, then by index within a label
        keys = LABELS[p] * LABELS.size + p
        assert (np.diff(keys) > 0).all()
    again = extreme_partition(LABELS, 10)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_dirichlet_partition_follows_the_seed_and_alpha() -> None:
    skewed = dirichlet_partition(LABELS, 10, 0.1, seed=4, num_classes=10)
    _assert_each_sample_once(skewed, LABELS.size)
    again = dirichlet_partition(LABELS, 10, 0.1, seed=4, num_classes=10)
    assert all(np.array_equal(a, b) for a, b in zip(skewed, again, strict=True))
    other = dirichlet_partition(LABELS, 10, 0.1, seed=5, num_classes=10)
    assert not all(np.array_equal(a, b) for a, b in zip(skewed, other, strict=True))
    mild = dirichlet_partition(LABELS, 10, 100.0, seed=4, num_classes=10)
    _assert_each_sample_once(mild, LABELS.size)
    # a worker's largest class: most of its data at alpha 0.1, about a tenth at 100
    def top_share(parts: list[np.ndarray]) -> float:
        counts = class_counts(parts, LABELS, 10)
        held = counts.sum(axis=1) > 0
        return float(np.median(counts[held].max(axis=1) / counts[held].sum(axis=1)))

    assert top_share(skewed) > 0.6 and top_share(mild) < 0.2
    assert np.median(_classes_held(skewed)) <= 4 and min(_classes_held(mild)) == 10
    for p in skewed:  # each class's piece in index order, the classes in order
        keys = LABELS[p] * LABELS.size + p
        assert (np.diff(keys) > 0).all()


def test_dirichlet_splits_each_class_at_its_drawn_proportions() -> None:
    """Worker j holds floor(c_j * count) - floor(c_(j-1) * count) samples of a class, c
    the cumulative proportions drawn for that class (ByzFL's cut points)."""
    from common.learn.seeding import derive_rng

    parts = dirichlet_partition(LABELS, 6, 0.5, seed=2, num_classes=10)
    shares = derive_rng(2, "partition-dirichlet").dirichlet(np.full(6, 0.5), size=10)
    counts = class_counts(parts, LABELS, 10)
    for k in range(10):
        total = int(np.count_nonzero(k == LABELS))
        cuts = np.r_[0, (np.cumsum(shares[k])[:-1] * total).astype(np.int64), total]
        np.testing.assert_array_equal(counts[:, k], np.diff(cuts))


def test_gamma_partition_between_iid_and_extreme() -> None:
    iid = partition_indices(LABELS.size, 10, seed=3)
    one = gamma_partition(LABELS, 10, 1.0, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(one, iid, strict=True))
    zero = gamma_partition(LABELS, 10, 0.0, seed=3)
    assert all(np.array_equal(a, b)
               for a, b in zip(zero, extreme_partition(LABELS, 10), strict=True))
    half = gamma_partition(LABELS, 10, 0.5, seed=3)
    _assert_each_sample_once(half, LABELS.size)
    assert [p.size for p in half] == [300] * 10
    previous = 0
    for p in half:  # its iid share is of the first half of the data, then its extreme one
        shared, sorted_ = p[:150], p[150:]
        assert (shared < 1500).all() and (sorted_ >= 1500).all()
        assert (np.diff(LABELS[sorted_]) >= 0).all() and LABELS[sorted_[0]] >= previous
        previous = LABELS[sorted_[-1]]
    assert min(_classes_held(half)) >= 8  # the iid half gives every worker most classes
    with pytest.raises(ValueError, match="gamma must be in"):
        gamma_partition(LABELS, 10, 1.5, seed=3)


def _synthetic_config(**changes: object) -> RunConfig:
    return RunConfig(**{"dataset": "synthetic", "num_workers": 8, "seed": 0} | changes
                     ).validate()


def test_run_partitions_iid_is_todays_partition() -> None:
    ds = load_dataset("synthetic", seed=0)
    parts = run_partitions(_synthetic_config(), ds)
    expected = partition_indices(len(ds.train_y), 8, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, expected, strict=True))


def test_a_worker_with_less_than_a_batch_is_a_configuration_error() -> None:
    ds = load_dataset("synthetic", seed=0)
    # seed 0, n=8, alpha 0.1 leaves worker 4 with 27 of the 2048 samples
    cfg = _synthetic_config(partition="dirichlet", alpha=0.1)
    with pytest.raises(ConfigError) as info:
        run_partitions(cfg, ds)
    assert str(info.value) == (
        "--partition dirichlet --alpha 0.1 leaves worker 4 with 27 training samples, fewer "
        "than one batch (--batch-size 32); use another --seed, fewer --workers, a smaller "
        "--batch-size or a milder partition")
    assert len(run_partitions(_synthetic_config(partition="dirichlet", alpha=0.1,
                                                batch_size=27), ds)[4]) == 27
    with pytest.raises(ConfigError, match="worker 0 with 256 training samples"):
        run_partitions(_synthetic_config(batch_size=257), ds)


def test_iid_workers_take_an_iid_share_and_the_others_split_the_data() -> None:
    """ByzFL's convention: the heterogeneous split over the workers not named, each named
    one with its share of the iid partition of the same seed."""
    ds = load_dataset("synthetic", seed=0)
    labels = ds.train_y.numpy()
    parts = run_partitions(_synthetic_config(partition="extreme", iid_workers=(0, 5)), ds)
    iid = partition_indices(labels.size, 8, seed=0)
    for named in (0, 5):
        np.testing.assert_array_equal(parts[named], iid[named])
    split = extreme_partition(labels, 6)
    for part, expected in zip([parts[w] for w in (1, 2, 3, 4, 6, 7)], split, strict=True):
        np.testing.assert_array_equal(part, expected)
    # the others hold every sample once: all the classes stay with them
    others = np.concatenate([parts[w] for w in (1, 2, 3, 4, 6, 7)])
    assert np.array_equal(np.sort(others), np.arange(labels.size))
    # no effect with an iid partition; ids checked against n
    plain = run_partitions(_synthetic_config(iid_workers=(0, 5)), ds)
    assert all(np.array_equal(a, b) for a, b in zip(plain, iid, strict=True))
    for bad, message in (((8,), "--iid-workers id 8 out of range 0..7"),
                         ((1, 1), "duplicate --iid-workers ids"),
                         (tuple(range(8)), "must leave at least one worker")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            _synthetic_config(iid_workers=bad)


def test_partition_json_holds_each_workers_class_counts(tmp_path: Path) -> None:
    ds = load_dataset("synthetic", seed=0)
    cfg = _synthetic_config(partition="extreme")
    path = write_partition(tmp_path, cfg, ds)
    assert path == tmp_path / PARTITION_FILE
    record = __import__("json").loads(path.read_text())
    assert {k: record[k] for k in ("partition", "alpha", "gamma", "seed", "dataset",
                                   "batch_size")} == {
        "partition": "extreme", "alpha": 1.0, "gamma": 0.5, "seed": 0,
        "dataset": "synthetic", "batch_size": 32}
    counts = np.array(record["counts"])
    labels = ds.train_y.numpy()
    assert counts.shape == (8, 10) and counts.sum() == labels.size
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels, minlength=10))
    np.testing.assert_array_equal(counts, class_counts(run_partitions(cfg, ds), labels, 10))


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
