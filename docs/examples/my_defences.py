"""A rule and an attack of one's own, outside the byzps package (docs/plugins.md).

Name them by dotted path wherever a rule or an attack is named:

    ps-simulate --rule my_defences:MedianOfMeans --mom-group 3 \
        --worker-attack my_defences:ScaledMean --byzantine-workers 0,1 --scaled-mean-factor -4
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from common.conf.settings import setting
from common.learn.attacks import VectorAttack
from common.learn.rules import OptionSettings, Rule


class MedianOfMeans(Rule):
    """Median of means: the rows averaged in consecutive groups of ``group``, then the
    coordinate-wise median of the group means (a rule that needs q < n/4, say)."""

    name = "median-of-means"
    summary = "coordinate-wise median of the means of consecutive groups of rows"
    needs = "4q < n"
    precondition = staticmethod(lambda n, q: 4 * q < n)
    options = ("group",)
    group: int

    @dataclass(frozen=True)
    class Settings(OptionSettings):
        group: int = setting(2, "Median of means (a plugin's): rows per group.",
                             flag="--mom-group", minimum=1)

    def aggregate(self, G: torch.Tensor) -> torch.Tensor:
        k = max(1, min(self.group, G.shape[0]))
        n = G.shape[0] - G.shape[0] % k
        means = G[:n].reshape(n // k, k, G.shape[1]).mean(dim=1)
        return means.median(dim=0).values


def scaled_mean(honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
                factor: float = -4.0) -> np.ndarray:
    """Every Byzantine row is the honest rows' mean times ``factor``."""
    row = honest.mean(axis=0, dtype=np.float32) * np.float32(factor)
    return np.repeat(row[None, :], num_byzantine, axis=0)


@dataclass(frozen=True)
class ScaledMean(VectorAttack):
    """The honest mean, scaled (a sign flip of the mean with a negative factor)."""

    name: ClassVar[str] = "scaled-mean"
    function = staticmethod(scaled_mean)
    summary: ClassVar[str] = "the honest rows' mean times `--scaled-mean-factor`"

    factor: float = setting(-4.0, "Scaled mean (a plugin's): the factor.",
                            flag="--scaled-mean-factor")
