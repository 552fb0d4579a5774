"""Inner-Product Manipulation (Xie, Koyejo, Gupta, UAI 2019): Byzantine vectors are
-epsilon times the honest mean (classic model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.learn.attacks.base import VectorAttack, negated_copies, register_attack, row_mean


def ipm(
    honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, epsilon: float = 0.1
) -> np.ndarray:
    """Inner-Product Manipulation (Xie, Koyejo, Gupta, 2019): ``-epsilon * mean(honest)``.

    A small epsilon keeps the Byzantine vectors close to the honest ones while making the
    inner product of the aggregate with the true gradient negative. ``rng`` is not used.
    """
    return negated_copies(honest, num_byzantine, row_mean, "ipm epsilon", epsilon)


@register_attack
@dataclass(frozen=True)
class Ipm(VectorAttack):
    """``-epsilon * mean(honest)``."""

    name: ClassVar[str] = "ipm"
    function = staticmethod(ipm)
    summary: ClassVar[str] = "-`--ipm-epsilon` × the mean of the correct vectors"

    epsilon: float = setting(0.1, "IPM attack: sends -epsilon * (mean of the correct "
                             "vectors).", flag="--ipm-epsilon")

