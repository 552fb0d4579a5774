"""``--validation``: a stratified held-out part of the training set as a run's evaluation
set, the same in every process, none of it in any worker's data; the run hash unchanged
at the default."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from common.conf.settings import hash_input
from common.errors import ConfigError
from common.learn.data import load_dataset, run_dataset, run_partitions
from common.learn.data.validation import validation_split
from common.run.config import AttackConfig, RunConfig
from ps.experiments.grid import Cell
from ps.reference.engine import Simulation
from tests.unit.common.test_data import write_idx_dir
from worker.evaluator import Evaluator
from worker.trainer import GradientComputer

ROOT = Path(__file__).resolve().parents[3]
FRACTION = 0.2


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Fashion-MNIST of 400 random training images (about 40 a class)."""
    directory = tmp_path_factory.mktemp("idx")
    write_idx_dir(directory, gz=False, n_train=400, n_test=20)
    return directory


def _cfg(**changes) -> RunConfig:
    settings = {"dataset": "fashion-mnist", "num_workers": 4, "num_shards": 1, "rule": "mean",
                "batch_size": 8, "validation": FRACTION, **changes}
    return RunConfig(**settings).validate()


@pytest.mark.parametrize("spared", [(), (0,)])
@pytest.mark.parametrize("partition", ["iid", "dirichlet", "extreme", "gamma"])
def test_the_workers_share_exactly_the_samples_not_held_out(data_dir: Path, partition: str,
                                                            spared: tuple[int, ...]) -> None:
    cfg = _cfg(partition=partition, iid_workers=spared)
    raw = load_dataset(cfg.dataset, data_dir)
    kept, held = validation_split(raw.train_y.numpy(), FRACTION, raw.num_classes)
    dataset = run_dataset(cfg, data_dir)
    assert torch.equal(dataset.train_x, raw.train_x[kept])
    assert torch.equal(dataset.test_x, raw.train_x[held])
    assert torch.equal(dataset.test_y, raw.train_y[held])
    trained = np.concatenate([kept[p] for p in run_partitions(cfg, dataset)])
    assert np.intersect1d(trained, held).size == 0
    if not spared or partition == "iid":  # (an --iid-workers share overlaps the split's)
        assert np.array_equal(np.sort(trained), kept)  # every kept sample, once
    assert dataset.evaluated_on == "validation"


def test_each_class_holds_out_its_share() -> None:
    labels = np.repeat(np.arange(4), [10, 25, 3, 7])
    kept, held = validation_split(labels, 0.2, 5)  # class 4 has no sample: none held out
    assert np.bincount(labels[held], minlength=5).tolist() == [2, 5, 1, 1, 0]
    assert np.array_equal(np.sort(np.concatenate([kept, held])), np.arange(labels.size))
    assert np.all(np.diff(kept) > 0)


def test_the_split_depends_on_the_data_and_the_fraction_not_the_seed(data_dir: Path) -> None:
    first, other_seed = run_dataset(_cfg(seed=0), data_dir), run_dataset(_cfg(seed=100), data_dir)
    assert torch.equal(first.test_x, other_seed.test_x)
    assert torch.equal(first.train_x, other_seed.train_x)
    labels = first.train_y.numpy()
    assert len(validation_split(labels, 0.3, 10)[1]) != len(validation_split(labels, 0.2, 10)[1])


def _digest(cfg: RunConfig, data_dir: Path) -> str:
    dataset = run_dataset(cfg, data_dir)
    parts = run_partitions(cfg, dataset)
    h = hashlib.sha256(dataset.test_x.numpy().tobytes() + dataset.test_y.numpy().tobytes())
    for p in parts:
        h.update(p.tobytes())
    return h.hexdigest()


def test_a_fresh_process_draws_the_same_split(data_dir: Path) -> None:
    """Each worker and the evaluator load the run's dataset in their own interpreter."""
    code = ("import sys; from pathlib import Path; "
            "from tests.unit.common.test_validation_split import _cfg, _digest; "
            "print(_digest(_cfg(partition='dirichlet'), Path(sys.argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, str(data_dir)], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == _digest(_cfg(partition="dirichlet"), data_dir)


def test_the_engine_the_workers_and_the_evaluator_use_the_same_split(data_dir: Path) -> None:
    cfg = _cfg(partition="dirichlet")
    engine = Simulation(cfg, AttackConfig(), run_dataset(cfg, data_dir))
    worker = GradientComputer(cfg, run_dataset(cfg, data_dir))  # as worker/run.py builds it
    assert all(np.array_equal(a, b) for a, b in
               zip(engine.computer.partitions, worker.partitions, strict=True))
    evaluator = Evaluator(cfg, run_dataset(cfg, data_dir))  # as worker/evaluator.py
    assert torch.equal(evaluator.y, run_dataset(cfg, data_dir).test_y)
    assert evaluator.split == "validation"


def test_a_dataset_not_built_for_the_run_is_refused(data_dir: Path) -> None:
    cfg, raw = _cfg(), load_dataset("fashion-mnist", data_dir)
    for build in (lambda: GradientComputer(cfg, raw), lambda: Evaluator(cfg, raw),
                  lambda: Evaluator(_cfg(validation=0.0), run_dataset(cfg, data_dir))):
        with pytest.raises(ValueError, match="load it with run_dataset"):
            build()


def test_the_default_leaves_every_hash_and_cell_key_what_it_was() -> None:
    default = RunConfig().validate()
    assert default.config_hash == "1b4005db4f473390"  # as before --validation existed
    assert "validation" not in hash_input(default)
    assert RunConfig(validation=0.1).validate().config_hash != default.config_hash
    cell = Cell("grid", "", {"rule": "mean", "seed": 0}, {})
    assert cell.key == "1af0953b11cd40a1520e" and "validation" not in cell.tags()
    held = Cell("grid", "", {"rule": "mean", "seed": 0, "validation": 0.1}, {})
    assert held.key != cell.key and held.tags()["validation"] == 0.1


@pytest.mark.parametrize(("value", "needle"), [
    (1.0, "--validation must be below 1 (the share of the training set held out; 0: off), "
          "got 1"),
    (1.5, "--validation must be in [0, 1], got 1.5"),
    (-0.1, "--validation must be in [0, 1], got -0.1"),
])
def test_a_fraction_out_of_range_is_refused(value: float, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        RunConfig(validation=value).validate()


@pytest.mark.parametrize(("fraction", "needle"), [
    (0.1, "--validation 0.1 of class 1's 4 training samples holds out 0: each class needs "
          "at least one sample on each side; use a fraction between 0.125 and 0.875"),
    (0.9, "--validation 0.9 of class 1's 4 training samples holds out 4"),
    (0.0, "--validation must be in (0, 1) to hold out part of the training set, got 0"),
])
def test_a_class_too_small_to_split_is_refused(fraction: float, needle: str) -> None:
    labels = np.repeat(np.arange(2), [20, 4])
    with pytest.raises(ConfigError, match=re.escape(needle)):
        validation_split(labels, fraction, 2)
