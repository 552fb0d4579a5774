"""The heterogeneity benchmark's no-attack baseline (``workers = 13``) trains on exactly
the split its attacked runs give their 13 honest workers (17 workers, the Byzantine 0-3
taking iid shares: ``--iid-workers``), so an attack's cost is not mixed with a change
of the honest workers' data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.learn.data.base import Dataset
from common.learn.data.sampling import run_partitions
from common.run.config import RunConfig

BYZANTINE = (0, 1, 2, 3)


def _labels(num_classes: int = 10, per_class: int = 3000) -> Dataset:
    rng = np.random.default_rng(5)
    labels = torch.from_numpy(rng.permutation(np.repeat(np.arange(num_classes), per_class)))
    images = torch.zeros(labels.numel(), 1, 1, 1)
    return Dataset("labels", images, labels, images[:1], labels[:1], (1, 1, 1), num_classes)


@pytest.mark.parametrize("split", [{"partition": "dirichlet", "alpha": 0.1},
                                   {"partition": "dirichlet", "alpha": 1.0},
                                   {"partition": "gamma", "gamma": 0.5},
                                   {"partition": "extreme"}])
def test_the_baseline_holds_the_attacked_runs_honest_split(split: dict) -> None:
    data = _labels()
    attacked = RunConfig(num_workers=17, q=4, seed=3, batch_size=8, iid_workers=BYZANTINE, **split)
    baseline = RunConfig(num_workers=13, q=4, seed=3, batch_size=8, **split)
    honest = run_partitions(attacked, data)[len(BYZANTINE):]
    alone = run_partitions(baseline, data)
    assert len(alone) == len(honest) == 13
    for mine, theirs in zip(alone, honest, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    # and the honest workers of the attacked run hold the whole training set
    assert np.array_equal(np.sort(np.concatenate(honest)), np.arange(data.train_y.numel()))
