"""Gambler (paper, Sec. 6): the owner of one parameter server multiplies any value it
receives by a huge factor with a small probability (generalized Byzantine model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.learn.attacks.base import (
    Site,
    ValueAttack,
    check_values,
    float32_scale,
    register_attack,
)
from common.learn.seeding import derive_rng


def gambler(
    values: np.ndarray, rng: np.random.Generator, p: float = 5e-4, scale: float = -1e20
) -> tuple[np.ndarray, int]:
    """Multiply each value by ``scale`` independently with probability ``p`` (paper, Sec. 6).

    The paper's gambler owns one of 20 parameter servers and multiplies any value it
    receives by -1e20 with probability 0.05 %. The mask is ``rng.random(values.size) < p``,
    so exactly ``values.size`` uniforms are drawn whatever ``p``. The product is computed in
    float32: for ``|v| > ~3.4e18`` ``v * -1e20`` overflows to -inf/+inf (no warning is
    raised), which is still a Byzantine value. Returns ``(new_values, number_corrupted)``.
    """
    check_values(values)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"gambler probability p must be in [0, 1], got {p!r}")
    factor = float32_scale("gambler scale", scale)
    mask = rng.random(values.size) < p
    out = values.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        out[mask] = values[mask] * factor
    return out, int(np.count_nonzero(mask))


@register_attack
@dataclass(frozen=True)
class Gambler(ValueAttack):
    """Each value of each push times ``scale`` with probability ``p``."""

    name: ClassVar[str] = "gambler"
    summary: ClassVar[str] = "each value times `--gambler-scale` with probability `--gambler-p`"

    p: float = setting(5e-4, "Gambler: probability that a value is corrupted (paper 0.0005).",
                       flag="--gambler-p", minimum=0.0, maximum=1.0)
    scale: float = setting(-1e20, "Gambler: factor applied to a corrupted value.",
                           flag="--gambler-scale")

    def corrupt(self, values: np.ndarray, site: Site) -> tuple[np.ndarray, int]:
        rng = derive_rng(site.seed, f"proxy-gambler-{site.what}", site.round, site.worker,
                         site.shard)
        return gambler(values, rng, p=self.p, scale=self.scale)
