"""A Little Is Enough (Baruch, Baruch, Goldberg, NeurIPS 2019): Byzantine vectors at
``mean - z * std`` of the honest ones, coordinate-wise (classic model)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.errors import ConfigError
from common.learn.attacks.base import VectorAttack, check_honest, register_attack, repeat


def alie_z(n: int, num_byzantine: int) -> float:
    """ALIE's default z (Baruch et al., 2019): ``s = floor(n/2 + 1) - f``,
    ``z = Phi^{-1}((n - s) / n)``."""
    s = math.floor(n / 2 + 1) - num_byzantine
    if n < 1 or s < 1:
        raise ValueError(
            f"ALIE's z is undefined for n={n}, f={num_byzantine}: needs n >= 1 and "
            f"s = floor(n/2 + 1) - f >= 1 (got s={s}); pass z explicitly"
        )
    return NormalDist().inv_cdf((n - s) / n)


def alie(
    honest: np.ndarray,
    num_byzantine: int,
    rng: np.random.Generator,
    z: float | None = None,
    n: int | None = None,
) -> np.ndarray:
    """A Little Is Enough (Baruch et al., 2019): ``mean - z * std``, coordinate-wise.

    Mean and standard deviation are over the honest rows, computed in float64 and cast to
    float32; the std is the population one (``ddof=0``, defined for a single row too).
    ``z`` defaults to :func:`alie_z` with ``n`` workers in all (default: honest rows +
    ``num_byzantine``) and ``f = num_byzantine``. ``rng`` is not used.
    """
    check_honest(honest, num_byzantine)
    if z is None:
        z = alie_z(honest.shape[0] + num_byzantine if n is None else n, num_byzantine)
    elif not math.isfinite(z):
        raise ValueError(f"ALIE z must be finite, got {z!r}")
    mean = honest.mean(axis=0, dtype=np.float64)
    std = honest.std(axis=0, dtype=np.float64)
    return repeat(mean - z * std, num_byzantine)


@register_attack
@dataclass(frozen=True)
class Alie(VectorAttack):
    """``mean - z * std`` of the honest vectors; z from n and f unless given."""

    name: ClassVar[str] = "alie"
    summary: ClassVar[str] = "mean - z × std of the correct vectors (`--alie-z`, default from n, f)"

    z: float | None = setting(None, "ALIE attack: z (default from n and the number of "
                              "Byzantine workers).", flag="--alie-z")

    def check(self, num_workers: int, num_byzantine: int) -> None:
        super().check(num_workers, num_byzantine)
        if self.z is None:
            try:
                alie_z(num_workers, max(num_byzantine, 1))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def forge(self, honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
              num_workers: int) -> np.ndarray:
        return alie(honest, num_byzantine, rng, z=self.z, n=num_workers)
