"""Optimised ALIE: ALIE (Baruch, Baruch, Goldberg, NeurIPS 2019) with its factor z searched,
each round, against the aggregation the run's servers actually compute (ByzFL's
optimised ALIE: its ``LineMaximize`` attack optimiser; classic model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.learn.attacks.alie import alie
from common.learn.attacks.base import Aim, register_attack
from common.learn.attacks.optimised import DELTA, EVALS, RATIO, START, Optimised, search_factor


def alie_opt(honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, aim: Aim,
             evals: int = EVALS, start: float = START, delta: float = DELTA,
             ratio: float = RATIO) -> np.ndarray:
    """``mean - z * std`` (:func:`common.learn.attacks.alie.alie`) with the z >= 0 that
    :func:`common.learn.attacks.base.line_maximize` finds for the largest
    ``||Aggr(honest + forged) - mean(honest)||``, ``Aggr`` the run's pre-aggregation and
    rule on every shard (``aim``): the factor each defence lets through furthest, instead
    of the fixed z of n and f. ``rng`` is not used."""
    z = search_factor(honest, num_byzantine, aim,
                      lambda x: alie(honest, num_byzantine, rng, z=x), evals, start, delta,
                      ratio)
    return alie(honest, num_byzantine, rng, z=z)


@register_attack
@dataclass(frozen=True)
class AlieOpt(Optimised):
    """ALIE with z searched against the configured rule every round."""

    name: ClassVar[str] = "alie-opt"
    function = staticmethod(alie_opt)
    flag_prefix: ClassVar[str] = "alie-opt"
    summary: ClassVar[str] = ("ALIE's mean - z × std with z searched each round against the "
                              "configured --pre and --rule (ByzFL's line search, "
                              "`--alie-opt-evals` evaluations)")

    evals: int = setting(EVALS, "Optimised ALIE: evaluations of the line search per round "
                         "(ByzFL's 16).", flag="--alie-opt-evals", minimum=1)
    start: float = setting(START, "Optimised ALIE: first z evaluated (ByzFL's 0).",
                           flag="--alie-opt-start", minimum=0.0)
    delta: float = setting(DELTA, "Optimised ALIE: first step of the line search "
                           "(ByzFL's 1).", flag="--alie-opt-delta", minimum=0.0)
    ratio: float = setting(RATIO, "Optimised ALIE: contraction of the step, in (0.5, 1) "
                           "(ByzFL's 0.8).", flag="--alie-opt-ratio", minimum=0.5, maximum=1.0)
