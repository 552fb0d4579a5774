"""Sign flip: Byzantine vectors are the negated honest gradient (classic model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.learn.attacks.base import VectorAttack, negated_copies, register_attack, row_mean


def signflip(
    honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, scale: float = 1.0
) -> np.ndarray:
    """Each Byzantine vector is ``-scale * mean(honest)``: the negated honest gradient.

    Reading used here: a sign-flipping worker sends the negative of the gradient it would
    have sent honestly, modelled by the mean of the honest rows. ``rng`` is not used.
    """
    return negated_copies(honest, num_byzantine, row_mean, "signflip scale", scale)


@register_attack
@dataclass(frozen=True)
class SignFlip(VectorAttack):
    """``-scale * mean(honest)``."""

    name: ClassVar[str] = "signflip"
    function = staticmethod(signflip)
    summary: ClassVar[str] = "-`--signflip-scale` × the mean of the correct vectors"

    scale: float = setting(1.0, "Sign-flip attack: sends -scale * (mean of the correct "
                           "vectors).", flag="--signflip-scale")

