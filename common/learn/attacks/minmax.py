"""Min-Max (Shejwalkar, Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning
Attacks and Defenses for Federated Learning", NDSS 2021), an AGR-agnostic attack: the
mean of the honest vectors pushed along a perturbation as far as the Byzantine vector can
go while its largest distance to an honest vector stays within the largest distance
between two honest vectors (classic model).

This module also holds what Min-Max and Min-Sum (``minsum.py``) share: the perturbation
vectors and the search for gamma.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.errors import ConfigError
from common.learn.attacks.base import VectorAttack, check_honest, register_attack, repeat

PERTURBATIONS = ("unit", "std", "sign")
"""The paper's perturbations: inverse unit vector, inverse standard deviation, inverse sign."""
PAPER_PERTURBATION = "std"  # the authors' released experiments (dev_type='std')
GAMMA_INIT = 10.0  # the authors' code: lamda = 10.0
TAU = 1e-5  # the authors' code: threshold_diff = 1e-5


def perturbation(honest: np.ndarray, kind: str) -> np.ndarray:
    """The perturbation p (float64) of the malicious vector ``mean - gamma * p``:

    * ``unit``: ``mean / ||mean||`` (zero if the mean is zero), the inverse unit vector;
    * ``std``: the coordinate-wise standard deviation of the honest vectors with ``ddof=1``
      (``torch.std``, as the authors' code computes it; zero for a single vector);
    * ``sign``: ``sign(mean)``.
    """
    data = honest.astype(np.float64)
    mean = data.mean(axis=0)
    if kind == "unit":
        norm = float(np.linalg.norm(mean))
        return mean / norm if norm > 0 else np.zeros_like(mean)
    if kind == "std":
        return data.std(axis=0, ddof=1) if data.shape[0] > 1 else np.zeros_like(mean)
    if kind == "sign":
        return np.sign(mean)
    raise ValueError(f"perturbation must be one of {', '.join(PERTURBATIONS)}, got {kind!r}")


def largest_gamma(fits: Callable[[float], bool], gamma_init: float = GAMMA_INIT,
                  tau: float = TAU) -> float:
    """The authors' search (their Algorithm 1, as released): from ``gamma = gamma_init``
    with step ``gamma_init``, halve the step each time and move gamma up by half the step
    where ``fits(gamma)``, down where not, until the last gamma that fit is within
    ``tau`` of the current one; the last gamma that fit (0 if none did)."""
    if not (math.isfinite(gamma_init) and gamma_init >= 0):
        raise ValueError(f"gamma_init must be finite and >= 0, got {gamma_init!r}")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be finite and > 0, got {tau!r}")
    gamma, step, good = gamma_init, gamma_init, 0.0
    while abs(good - gamma) > tau:
        if fits(gamma):
            good = gamma
            gamma += step / 2
        else:
            gamma -= step / 2
        step /= 2
    return good


def squared_distances(honest: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``||honest_i - vector||^2`` for each honest row (float64)."""
    diff = honest - vector
    return np.einsum("ij,ij->i", diff, diff)


def agr_agnostic(honest: np.ndarray, num_byzantine: int, kind: str, gamma_init: float,
                 tau: float, within: Callable[[np.ndarray, np.ndarray], bool]) -> np.ndarray:
    """``mean - gamma * perturbation`` with the largest gamma found for which
    ``within(squared distances of the malicious vector to the honest ones, honest squared
    distance matrix)``; ``num_byzantine`` float32 copies.

    Computed in float64 with ``einsum`` (no BLAS: the same bits whatever its thread
    count, in every process): the honest distance matrix once, from the rows'
    differences, and each candidate's distances from the deviations ``c_i = g_i - mean``
    as the quadratic ``||c_i + gamma p||^2 = ||c_i||^2 + 2 gamma <c_i, p> + gamma^2
    ||p||^2``, so that the search's steps cost O(h) each instead of O(h d)."""
    check_honest(honest, num_byzantine)
    data = honest.astype(np.float64)
    mean = data.mean(axis=0)
    p = perturbation(honest, kind).astype(np.float64)
    pairwise = np.stack([squared_distances(data, row) for row in data])
    deviations = data - mean
    norms = np.einsum("ij,ij->i", deviations, deviations)
    along = np.einsum("ij,j->i", deviations, p)
    p_norm = float(np.einsum("i,i->", p, p))
    with np.errstate(over="ignore", invalid="ignore"):
        gamma = largest_gamma(
            lambda g: bool(within(np.maximum(norms + 2 * g * along + g * g * p_norm, 0.0),
                                  pairwise)),
            gamma_init, tau)
        return repeat(mean - gamma * p, num_byzantine)


def minmax(honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
           perturbation: str = PAPER_PERTURBATION, gamma_init: float = GAMMA_INIT,
           tau: float = TAU) -> np.ndarray:
    """Min-Max (Shejwalkar, Houmansadr, NDSS 2021, Eq. 5): ``mean - gamma * p`` with the
    largest gamma such that ``max_i ||m - g_i||^2 <= max_{i,j} ||g_i - g_j||^2`` over the
    honest vectors g, searched with :func:`largest_gamma` (the authors' gamma_init 10 and
    tolerance 1e-5); p from :func:`perturbation` (default ``std``, the authors' released
    experiments). Computed in float64, sent as float32; ``rng`` is not used."""
    return agr_agnostic(honest, num_byzantine, perturbation, gamma_init, tau,
                        lambda d, pairwise: d.max() <= pairwise.max())


def check_search(prefix: str, perturbation_kind: str, gamma_init: float, tau: float) -> None:
    """``ConfigError`` naming the flag of a bad Min-Max/Min-Sum parameter."""
    if perturbation_kind not in PERTURBATIONS:
        raise ConfigError(f"--{prefix}-perturbation must be one of {', '.join(PERTURBATIONS)}")
    if not gamma_init >= 0:
        raise ConfigError(f"--{prefix}-gamma must be >= 0, got {gamma_init}")
    if not tau > 0:
        raise ConfigError(f"--{prefix}-tau must be > 0, got {tau}")


@register_attack
@dataclass(frozen=True)
class MinMax(VectorAttack):
    """The mean minus gamma times a perturbation, gamma as large as the honest spread
    allows (largest distance)."""

    name: ClassVar[str] = "minmax"
    function = staticmethod(minmax)
    summary: ClassVar[str] = ("mean − γ × perturbation (`--minmax-perturbation` std, unit, "
                              "sign), γ the largest found with the malicious vector's largest "
                              "distance to a correct one within the largest between two "
                              "correct ones (NDSS 2021)")

    perturbation: str = setting(
        PAPER_PERTURBATION, "Min-Max attack: perturbation subtracted from the mean: std (the "
        "coordinate-wise standard deviation, the authors' experiments), unit (the mean's unit "
        "vector) or sign (the mean's sign).", flag="--minmax-perturbation",
        choices=PERTURBATIONS)
    gamma_init: float = setting(GAMMA_INIT, "Min-Max attack: initial gamma of the search "
                                "(the authors' 10; gamma stays below twice it).",
                                flag="--minmax-gamma", minimum=0.0)
    tau: float = setting(TAU, "Min-Max attack: the search stops when gamma moves less than "
                         "this (the authors' 1e-5).", flag="--minmax-tau", minimum=0.0)

    def check(self, num_workers: int, num_byzantine: int) -> None:
        super().check(num_workers, num_byzantine)
        check_search("minmax", self.perturbation, self.gamma_init, self.tau)
