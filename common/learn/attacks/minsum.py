"""Min-Sum (Shejwalkar, Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning
Attacks and Defenses for Federated Learning", NDSS 2021), an AGR-agnostic attack: the
mean of the honest vectors pushed along a perturbation as far as the Byzantine vector can
go while the sum of its squared distances to the honest vectors stays within that of
every honest vector (classic model).

The bound is the *smallest* honest score ``min_i sum_j ||g_i - g_j||^2``, as the authors'
released code computes it (``min_score``).  The paper's Eq. 6 and its text ("upper
bounded by the sum of squared distances of any benign gradient from the other benign
gradients") can also be read as the *largest* score; that reading allows a gamma at
least as large (a malicious vector at least as far from the honest mean).  The released
code's smallest score is what runs here; there is no option for the other reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.learn.attacks.base import VectorAttack, register_attack
from common.learn.attacks.minmax import (
    GAMMA_INIT,
    PAPER_PERTURBATION,
    PERTURBATIONS,
    TAU,
    agr_agnostic,
    check_search,
)


def minsum(honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
           perturbation: str = PAPER_PERTURBATION, gamma_init: float = GAMMA_INIT,
           tau: float = TAU) -> np.ndarray:
    """Min-Sum (Shejwalkar, Houmansadr, NDSS 2021, Eq. 6): ``mean - gamma * p`` with the
    largest gamma such that ``sum_i ||m - g_i||^2 <= min_i sum_j ||g_i - g_j||^2`` over the
    honest vectors g: the smallest honest score, as the authors' code (``min_score``)
    computes it, not the largest the paper's wording allows (see the module). Same search and
    perturbations as :func:`common.learn.attacks.minmax.minmax`; ``rng`` is not used."""
    return agr_agnostic(honest, num_byzantine, perturbation, gamma_init, tau,
                        lambda d, pairwise: d.sum() <= pairwise.sum(axis=1).min())


@register_attack
@dataclass(frozen=True)
class MinSum(VectorAttack):
    """The mean minus gamma times a perturbation, gamma as large as the honest spread
    allows (sum of squared distances)."""

    name: ClassVar[str] = "minsum"
    function = staticmethod(minsum)
    summary: ClassVar[str] = ("mean − γ × perturbation (`--minsum-perturbation` std, unit, "
                              "sign), γ the largest found with the malicious vector's sum of "
                              "squared distances to the correct ones within every correct "
                              "one's (NDSS 2021)")

    perturbation: str = setting(
        PAPER_PERTURBATION, "Min-Sum attack: perturbation subtracted from the mean: std (the "
        "authors' experiments), unit or sign (see --minmax-perturbation).",
        flag="--minsum-perturbation", choices=PERTURBATIONS)
    gamma_init: float = setting(GAMMA_INIT, "Min-Sum attack: initial gamma of the search "
                                "(the authors' 10).", flag="--minsum-gamma", minimum=0.0)
    tau: float = setting(TAU, "Min-Sum attack: the search stops when gamma moves less than "
                         "this (the authors' 1e-5).", flag="--minsum-tau", minimum=0.0)

    def check(self, num_workers: int, num_byzantine: int) -> None:
        super().check(num_workers, num_byzantine)
        check_search("minsum", self.perturbation, self.gamma_init, self.tau)
