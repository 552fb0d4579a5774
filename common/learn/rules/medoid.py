"""Medoid: the input row minimising the sum of Euclidean distances to all rows.

Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD" (ICML 2018), Definition of
Medoid: ``argmin_{v in {v_i}} sum_i ||v - v_i||``.  It outputs one of its inputs, so it
is not dimensional Byzantine resilient; q is accepted (0 <= q < n) and not used.

Distances come from one float64 Gram matrix (``kernels.gram64``).  A row holding any
non-finite value is at +inf from every row: it is never selected while a finite row
exists, and finite rows are scored on their distances to the finite rows.  Ties go to
the lowest row index.  If no row is finite, the output is the coordinate-wise median
(MarMed) of all rows and ``last_info["fallback"] == "marmed"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from common.learn.rules.base import Rule, register_rule
from common.learn.rules.marmed import coordinate_median

if TYPE_CHECKING:
    import torch


@register_rule
class Medoid(Rule):
    """The row with the least total distance to the others; ``last_info["selected"]``."""

    name = "medoid"
    summary = "the input vector minimising the sum of distances to all inputs"

    def aggregate(self, G: torch.Tensor) -> torch.Tensor | np.ndarray:
        from common.learn.rules.kernels import gram

        D2, finite = gram.squared_distances(gram.gram64(G))
        rows = np.flatnonzero(finite)
        if rows.size == 0:
            self.last_info = {"selected": [], "fallback": "marmed"}
            return coordinate_median(G)
        scores = np.sqrt(D2[np.ix_(rows, rows)]).sum(axis=1)
        best = int(rows[np.argmin(scores)])
        self.last_info = {"selected": [best], "score": float(scores.min())}
        return G[best].clone()
