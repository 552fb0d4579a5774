"""Centered clipping (Karimireddy, He, Jaggi, "Learning from History for Byzantine
Robust Optimization", ICML 2021, Algorithm "CC").

Starting from the previous round's aggregate ``v_0`` (zero in the first round), ``L``
iterations of ``v <- v + (1/n) sum_i (g_i - v) min(1, tau / ||g_i - v||)``; the output
is ``v_L``, which is also the next round's start.  Defaults are the authors' (their
experiments' ``Clipping(tau=100, n_iter=1)``): ``tau = 100`` (``--cc-tau``) and
``L = 1`` (``--cc-iters``).  Each row moves the output by at most ``tau / n`` per
iteration, so q Byzantine rows move it by at most ``q tau / n``; the guarantee of the
paper needs worker momentum (someone else's setting) and a small Byzantine fraction
(its analysis: delta <= 0.1); q is accepted (0 <= q < n) and not used.

State: the previous aggregate survives a checkpoint and a resume (``get_state``:
``{"center": v}``, saved in the shard's checkpoint as ``rule_center``).  In a sharded
cluster each server clips its own shard's rows around its own shard's previous
aggregate, so the norms are those of the shard's coordinates (see the README on vector-level rules).

Norms are accumulated in float64 (``kernels.row_sq_distances``) and each update
``v + sum_i w_i (g_i - v)`` in float64 (``kernels.weighted_shift``), so a row of 3.4e38
values is clipped, not overflowed.  Non-finite values: a row holding a NaN or an
infinity has no direction to clip along; it contributes nothing (weight 0, as if
clipped to length 0) and is never read, so the output stays finite.
``last_info``: ``{"clipped": rows clipped in the last iteration, "skipped": non-finite
rows}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from common.conf.settings import setting
from common.learn.rules.base import (
    OptionSettings,
    Rule,
    RuleError,
    as_positive_float,
    as_positive_int,
    register_rule,
)

if TYPE_CHECKING:
    import torch


@register_rule
class CenteredClipping(Rule):
    """Iterative clipping around the previous aggregate; stateful."""

    name = "centered-clipping"
    summary = ("from the previous aggregate v, L times: v plus the mean of the g_i - v "
               "clipped to norm tau (`--cc-tau` 100, `--cc-iters` 1)")
    options = ("tau", "iters")
    stateful = True
    tau: float
    iters: int

    @dataclass(frozen=True)
    class Settings(OptionSettings):
        tau: float = setting(100.0, "Centered clipping: clipping radius tau (the authors' "
                             "100).", flag="--cc-tau", minimum=0.0)
        iters: int = setting(1, "Centered clipping: clipping iterations L per round (the "
                             "authors' 1).", flag="--cc-iters", minimum=1)

    @classmethod
    def check(cls, n: int, q: int, **options: Any) -> dict[str, Any]:
        options = super().check(n, q, **options)
        return {"tau": as_positive_float(options["tau"], "centered-clipping option tau"),
                "iters": as_positive_int(options["iters"], "centered-clipping option iters")}

    def __init__(self, n: int, q: int, **options: Any) -> None:
        super().__init__(n, q, **options)
        self.center: np.ndarray | None = None

    def get_state(self) -> dict[str, np.ndarray]:
        return {} if self.center is None else {"center": self.center}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        unknown = sorted(set(state) - {"center"})
        if unknown:
            raise RuleError(f"centered-clipping state has unknown entries {unknown}")
        center = state.get("center")
        self.center = None if center is None else np.asarray(center, dtype=np.float32)

    def aggregate(self, G: torch.Tensor) -> np.ndarray:
        from common.learn.rules.kernels import reductions

        X = G.numpy()
        n, d = X.shape
        v = np.zeros(d, dtype=np.float32) if self.center is None else self.center
        if v.shape != (d,):
            raise RuleError(f"centered-clipping state holds {v.size} values, the input "
                            f"has d={d}")
        clipped = skipped = 0
        for _ in range(self.iters):
            dist2 = reductions.row_sq_distances(X, v)
            rows = np.flatnonzero(np.isfinite(dist2))
            dist = np.sqrt(dist2[rows])
            far = dist > self.tau
            scale = np.ones(rows.size)
            scale[far] = self.tau / dist[far]
            v = reductions.weighted_shift(X, v, rows, scale / n)
            clipped, skipped = int(far.sum()), n - rows.size
        self.center = v
        self.last_info = {"clipped": clipped, "skipped": skipped}
        return v.copy()  # the caller may keep or change its copy; the state stays ours
