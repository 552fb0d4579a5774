"""ARC, adaptive robust clipping (Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan,
"The Vital Role of Gradient Clipping in Byzantine-Resilient Distributed Learning",
2024, arXiv:2405.14432; as implemented by ByzFL).

With k = floor(2 (q/n) (n - q)), the k rows of largest norm are clipped to the norm of
the largest of the others: with the norms sorted ``||x_(1)|| <= ... <= ||x_(n)||``,
``y_i = x_i min(1, ||x_(n-k)|| / ||x_i||)`` for those k rows, the other rows unchanged.
k is computed in integers (2 q (n - q) // n), so it is exact; k = 0 (q = 0) changes
nothing.  Needs 2q < n.  Ties in norm go to the lower row index (it stays unclipped).
In a sharded cluster the norms are those of the shard's sub-vectors (see
``common.learn.rules.pre.base``).

Norms are accumulated in float64 and a clipped row is scaled in float64, so rows of
3.4e38 values clip without overflow.  Non-finite values: a row holding a NaN or an
infinity has norm +inf, so it is among the first clipped; a clipped non-finite row has no
direction and becomes the zero vector (inside the clipping ball).  If more than k rows
are non-finite the threshold itself is infinite and they are passed on unchanged.
``last_info``: ``{"clipped": rows scaled down, "threshold": the clipping norm}``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from common.learn.rules.base import median_bound
from common.learn.rules.pre.base import PreAggregator, RoundContext, register_pre

if TYPE_CHECKING:
    import torch


def arc_count(n: int, q: int) -> int:
    """floor(2 (q/n) (n - q)), exactly."""
    return 2 * q * (n - q) // n


@register_pre
class ARC(PreAggregator):
    """Clip the floor(2(q/n)(n-q)) largest rows to the next largest norm."""

    name = "arc"
    summary = "clip the floor(2(q/n)(n-q)) largest rows by norm to the norm of the next largest"
    needs = "2q < n"
    precondition = staticmethod(lambda n, q: q <= median_bound(n))

    def apply(self, G: torch.Tensor, context: RoundContext) -> torch.Tensor | np.ndarray:
        k = arc_count(self.n, self.q)
        if k == 0:
            return G
        from common.learn.rules.kernels import reductions

        norms2 = reductions.row_sq_distances(G.numpy())
        key = np.where(np.isfinite(norms2), norms2, np.inf)
        order = np.argsort(key, kind="stable")
        threshold = math.sqrt(key[order[self.n - k - 1]])
        X = G.numpy()
        out = None
        clipped = []
        for i in order[self.n - k:]:
            norm = math.sqrt(key[i])
            if not norm > threshold or math.isinf(threshold):
                continue
            if out is None:
                out = X.copy()
            if math.isinf(norm):
                out[i] = 0.0
            else:
                out[i] = (X[i].astype(np.float64) * (threshold / norm)).astype(np.float32)
            clipped.append(int(i))
        self.last_info = {"clipped": clipped, "threshold": threshold}
        return G if out is None else out
