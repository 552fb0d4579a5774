"""Omniscient (paper, Sec. 6): Byzantine vectors are -scale times the sum of the correct
gradients (classic model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.learn.attacks.base import VectorAttack, negated_copies, register_attack, row_sum


def omniscient(
    honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, scale: float = 1e20
) -> np.ndarray:
    """Each Byzantine vector is ``-scale * sum(honest)`` (paper, Sec. 6, scale 1e20).

    The sum is taken in float32, adding the rows in order (as ``np.sum(axis=0)`` does on a
    C-contiguous array); the product is float32 too, so coordinates whose ``|scale * sum|``
    exceeds ~3.4e38 become -inf/+inf. ``rng`` is not used.
    """
    return negated_copies(honest, num_byzantine, row_sum, "omniscient scale", scale)


@register_attack
@dataclass(frozen=True)
class Omniscient(VectorAttack):
    """``-scale * sum(honest)``: the attacker sees every correct gradient of the round."""

    name: ClassVar[str] = "omniscient"
    function = staticmethod(omniscient)
    summary: ClassVar[str] = "-`--omniscient-scale` (1e20) × the sum of the correct vectors"

    scale: float = setting(1e20, "Omniscient attack: sends -scale * (sum of the correct "
                           "vectors).", flag="--omniscient-scale")

