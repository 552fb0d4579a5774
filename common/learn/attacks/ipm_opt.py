"""Optimised IPM: Inner-Product Manipulation (Xie, Koyejo, Gupta, UAI 2019, "Fall of
Empires") with its factor searched, each round, against the aggregation the run's servers
actually compute (ByzFL's optimised FOE: its ``LineMaximize`` attack optimiser; classic
model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import setting
from common.learn.attacks.base import Aim, register_attack
from common.learn.attacks.ipm import ipm
from common.learn.attacks.optimised import DELTA, EVALS, RATIO, START, Optimised, search_factor


def ipm_opt(honest: np.ndarray, num_byzantine: int, rng: np.random.Generator, aim: Aim,
            evals: int = EVALS, start: float = START, delta: float = DELTA,
            ratio: float = RATIO) -> np.ndarray:
    """``(1 - tau) * mean(honest)``, i.e. IPM's ``-epsilon * mean`` with ``epsilon = tau -
    1`` (:func:`common.learn.attacks.ipm.ipm`), with the tau >= 0 that
    :func:`common.learn.attacks.base.line_maximize` finds for the largest
    ``||Aggr(honest + forged) - mean(honest)||``, ``Aggr`` the run's pre-aggregation and
    rule on every shard (``aim``). ByzFL parameterises FOE by tau, so its search starts
    at the honest mean (tau = 0, epsilon = -1) and passes the fixed attack's epsilon 0.1
    at tau = 1.1. ``rng`` is not used."""
    tau = search_factor(honest, num_byzantine, aim,
                        lambda x: ipm(honest, num_byzantine, rng, epsilon=x - 1.0), evals,
                        start, delta, ratio)
    return ipm(honest, num_byzantine, rng, epsilon=tau - 1.0)


@register_attack
@dataclass(frozen=True)
class IpmOpt(Optimised):
    """IPM with its factor searched against the configured rule every round."""

    name: ClassVar[str] = "ipm-opt"
    function = staticmethod(ipm_opt)
    flag_prefix: ClassVar[str] = "ipm-opt"
    summary: ClassVar[str] = ("IPM's (1 - τ) × the mean of the correct vectors (ε = τ - 1) "
                              "with τ searched each round against the configured --pre and "
                              "--rule (ByzFL's line search, `--ipm-opt-evals` evaluations)")

    evals: int = setting(EVALS, "Optimised IPM: evaluations of the line search per round "
                         "(ByzFL's 16).", flag="--ipm-opt-evals", minimum=1)
    start: float = setting(START, "Optimised IPM: first tau evaluated (ByzFL's 0: the honest "
                           "mean; epsilon = tau - 1).", flag="--ipm-opt-start", minimum=0.0)
    delta: float = setting(DELTA, "Optimised IPM: first step of the line search "
                           "(ByzFL's 1).", flag="--ipm-opt-delta", minimum=0.0)
    ratio: float = setting(RATIO, "Optimised IPM: contraction of the step, in (0.5, 1) "
                           "(ByzFL's 0.8).", flag="--ipm-opt-ratio", minimum=0.5, maximum=1.0)
