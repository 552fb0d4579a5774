"""GeoMed: the geometric median ``argmin_v sum_i ||v - v_i||``, by smoothed Weiszfeld.

Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018), Definition of
GeoMed (classic Byzantine resilient; no closed form).  Weiszfeld's iteration
``v <- sum_i w_i v_i / sum_i w_i``, smoothed as in Pillutla, Kakade, Harchaoui ("Robust
Aggregation for Federated Learning", 2022) with ``w_i = 1 / max(||v - v_i||, eps * s)``
and ``s = median_i ||v - v_i||``, starts at the mean of the rows.  Every iterate is a
convex combination ``v = sum_i a_i v_i``, so the iteration runs on the coefficients ``a``
and one float64 Gram matrix ``K = G G^T``: ``||v - v_j||^2 = a^T K a - 2 (K a)_j + K_jj``;
each step is O(n^2) and the (d,) output is formed once at the end.

Stops when the step ``||v_new - v|| <= tol * median_i ||v_new - v_i||`` (``tol`` relative,
default 1e-6), or when over half the rows coincide with ``v`` (then ``v`` is the median),
or after ``max_iter`` steps (default 100).  Smoothing floor and tolerance both scale
with the *median* distance, so a minority of huge rows (1e20) does not loosen them.
``last_info``: ``{"iterations", "converged", "objective"}`` (objective: the sum of
distances at the output).

Non-finite values: rows holding any NaN or infinity are left out (coefficient 0, the
row never touched), so the output is finite while one row is.  If no row is finite, the
output is the coordinate-wise median (MarMed) and ``last_info["fallback"] = "marmed"``.
q is accepted (0 <= q < n) and not used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from common.learn.rules.base import Rule, as_positive_float, as_positive_int, register_rule
from common.learn.rules.marmed import coordinate_median

if TYPE_CHECKING:
    import torch


@register_rule
class GeoMed(Rule):
    """Geometric median by smoothed Weiszfeld in coefficient space."""

    name = "geomed"
    summary = "geometric median (Weiszfeld, smoothed; convergence in the metrics)"
    options = ("tol", "max_iter", "eps")
    tol: float
    max_iter: int
    eps: float

    @classmethod
    def check(cls, n: int, q: int, **options: Any) -> dict[str, Any]:
        options = super().check(n, q, **options)
        return {
            "tol": as_positive_float(options.get("tol", 1e-6), "geomed option tol"),
            "max_iter": as_positive_int(options.get("max_iter", 100), "geomed option max_iter"),
            "eps": as_positive_float(options.get("eps", 1e-8), "geomed option eps"),
        }

    def aggregate(self, G: torch.Tensor) -> torch.Tensor | np.ndarray:
        from common.learn.rules.kernels import gram

        K = gram.gram64(G)
        rows = np.flatnonzero(np.isfinite(np.diag(K)))
        if rows.size == 0:
            self.last_info = {"iterations": 0, "converged": False, "fallback": "marmed"}
            return coordinate_median(G)
        K = K[np.ix_(rows, rows)]
        a, iterations, converged, objective = self.weiszfeld(K)
        self.last_info = {
            "iterations": iterations,
            "converged": converged,
            "objective": objective,
        }
        X = G if rows.size == self.n else G[rows]
        return X.new_tensor(a.astype(np.float32)) @ X

    def weiszfeld(self, K: np.ndarray) -> tuple[np.ndarray, int, bool, float]:
        """Coefficients of the geometric median of the rows whose Gram matrix is ``K``."""
        m = K.shape[0]
        kd = np.diag(K)

        def distances(a: np.ndarray) -> np.ndarray:
            Ka = K @ a
            return np.sqrt(np.maximum(a @ Ka - 2.0 * Ka + kd, 0.0))

        a = np.full(m, 1.0 / m)
        dist = distances(a)
        scale = float(np.median(dist))
        iteration = 0
        converged = scale == 0.0  # over half the rows sit at v: v is the median
        while not converged and iteration < self.max_iter:
            iteration += 1
            w = 1.0 / np.maximum(dist, self.eps * scale)
            a_new = w / w.sum()
            step_a = a_new - a
            step = float(np.sqrt(max(step_a @ K @ step_a, 0.0)))
            a = a_new
            dist = distances(a)
            scale = float(np.median(dist))
            converged = bool(step <= self.tol * scale or scale == 0.0)
        return a, iteration, converged, float(dist.sum())
