"""Inf: every value of the Byzantine vectors is +inf (classic model; ByzFL's ``Inf``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.learn.attacks.base import VectorAttack, check_honest, register_attack


def inf(honest: np.ndarray, num_byzantine: int, rng: np.random.Generator) -> np.ndarray:
    """``(num_byzantine, d)`` float32 vectors of +inf, whatever the honest vectors (only
    their dimension is read). A rule that averages any of them outputs inf or NaN; a
    rule that discards non-finite rows, or sorts each coordinate and trims q >= f values
    from each end, does not move. ``rng`` is not used."""
    check_honest(honest, num_byzantine)
    return np.full((num_byzantine, honest.shape[1]), np.inf, dtype=np.float32)


@register_attack
@dataclass(frozen=True)
class Inf(VectorAttack):
    """Vectors of +inf."""

    name: ClassVar[str] = "inf"
    function = staticmethod(inf)
    summary: ClassVar[str] = "every value +inf"
    reads_honest: ClassVar[bool] = False
