"""Gaussian (paper, Sec. 6): Byzantine vectors drawn i.i.d. N(0, sd^2) (classic model)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.learn.attacks.base import VectorAttack, check_honest, register_attack


def gaussian(
    honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, sd: float = 200.0
) -> np.ndarray:
    """I.i.d. N(0, sd^2) vectors (paper, Sec. 6: 6 of 20 vectors with sd 200).

    Drawn as ``rng.standard_normal((num_byzantine, d), dtype=float32) * float32(sd)``.
    """
    check_honest(honest, num_byzantine)
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"gaussian sd must be finite and >= 0, got {sd!r}")
    noise = rng.standard_normal((num_byzantine, honest.shape[1]), dtype=np.float32)
    return noise * np.float32(sd)


@register_attack
@dataclass(frozen=True)
class Gaussian(VectorAttack):
    """I.i.d. N(0, sd^2) vectors; they do not depend on the honest ones."""

    name: ClassVar[str] = "gaussian"
    function = staticmethod(gaussian)
    summary: ClassVar[str] = "N(0, `--gaussian-sd`²) vectors"
    reads_honest: ClassVar[bool] = False

    sd: float = setting(200.0, "Gaussian attack: standard deviation (paper 200).",
                        flag="--gaussian-sd", minimum=0.0)
