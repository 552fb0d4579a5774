"""What the optimised ALIE and IPM (``alie_opt.py``, ``ipm_opt.py``) share: their search
settings and the search itself, ByzFL's line search of the attack factor against the
aggregation the run's servers compute (registers no attack)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from common.conf.settings import WORKER
from common.errors import ConfigError
from common.learn.attacks.base import Aim, VectorAttack, check_honest, line_maximize

EVALS, START, DELTA, RATIO = 16, 0.0, 1.0, 0.8  # ByzFL's LineMaximize defaults


def search_factor(honest: np.ndarray, num_byzantine: int, aim: Aim,
                  forge: Callable[[float], np.ndarray], evals: int = EVALS,
                  start: float = START, delta: float = DELTA, ratio: float = RATIO) -> float:
    """The factor :func:`line_maximize` finds for ``forge(factor)`` (the (f, d) forged
    rows), maximising ``aim.distance``: how far the servers' aggregate of the honest and
    forged rows lands from the honest mean."""
    check_honest(honest, num_byzantine)
    return line_maximize(lambda x: aim.distance(honest, forge(x)), evals, start, delta,
                         ratio)


@dataclass(frozen=True)
class Optimised(VectorAttack):
    """Base of the optimised attacks: Byzantine workers only (they build the aim from the
    run configuration; a proxy sees one shard and is not offered them)."""

    sites: ClassVar[frozenset[str]] = frozenset({WORKER})
    reads_rule: ClassVar[bool] = True
    flag_prefix: ClassVar[str]

    evals: int
    start: float
    delta: float
    ratio: float

    def forge(self, honest: np.ndarray, num_byzantine: int, rng: np.random.Generator,
              num_workers: int, aim: Aim | None = None) -> np.ndarray:
        """``function(honest, num_byzantine, rng, aim, evals=..., ...)``: the attack with
        its factor searched against ``aim``, the run's aggregation."""
        if aim is None:
            raise ValueError(f"{self.name} needs an aim (the run's aggregation)")
        return type(self).function(honest, num_byzantine, rng, aim, **self.parameters())

    def check(self, num_workers: int, num_byzantine: int) -> None:
        super().check(num_workers, num_byzantine)
        p = self.flag_prefix
        if self.evals < 1:
            raise ConfigError(f"--{p}-evals must be >= 1, got {self.evals}")
        if not self.start >= 0:
            raise ConfigError(f"--{p}-start must be >= 0, got {self.start}")
        if not self.delta > 0:
            raise ConfigError(f"--{p}-delta must be > 0, got {self.delta}")
        if not 0.5 < self.ratio < 1:
            raise ConfigError(f"--{p}-ratio must be in (0.5, 1), got {self.ratio}")
