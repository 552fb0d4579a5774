"""NNM, nearest-neighbour mixing (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan,
"Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
AISTATS 2023).

Each row is replaced by the mean of its n - q nearest rows in Euclidean distance,
itself included: ``y_i = (1/(n-q)) sum_{j in N_i} x_j``.  Ties in distance go to the
lower row index.  Needs 2q < n (the paper's honest majority).  Distances come from one
float64 Gram matrix (``kernels.gram64``); each mean is accumulated in float64
(``kernels.group_means``).  In a sharded cluster the neighbours are those of the
shard's sub-vectors (see ``common.learn.rules.pre.base``).

Non-finite values: a row holding a NaN or an infinity is at +inf from every row, so it
is nobody's neighbour while n - q finite rows exist (with fewer, each finite row mixes
all the finite rows); such a row is passed on unchanged, for the rule to treat as it
treats non-finite rows.  ``last_info``: ``{"passed": rows passed on unchanged}`` when
there are any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from common.learn.rules.base import median_bound
from common.learn.rules.pre.base import PreAggregator, RoundContext, register_pre

if TYPE_CHECKING:
    import torch


def neighbourhoods(D2: np.ndarray, finite: np.ndarray, k: int) -> list[np.ndarray]:
    """Row i's k nearest finite rows (itself included; ties by index), or [i] for a
    non-finite row i."""
    rows = np.flatnonzero(finite)
    k = min(k, rows.size)
    out = []
    for i in range(D2.shape[0]):
        if not finite[i]:
            out.append(np.array([i]))
            continue
        order = np.argsort(D2[i, rows], kind="stable")
        out.append(rows[order[:k]])
    return out


@register_pre
class NNM(PreAggregator):
    """Every row becomes the mean of its n - q nearest rows."""

    name = "nnm"
    summary = "each row becomes the mean of its n-q nearest rows (itself included)"
    needs = "2q < n"
    precondition = staticmethod(lambda n, q: q <= median_bound(n))

    def apply(self, G: torch.Tensor, context: RoundContext) -> np.ndarray:
        from common.learn.rules.kernels import gram, reductions

        D2, finite = gram.squared_distances(gram.gram64(G))
        groups = neighbourhoods(D2, finite, self.n - self.q)
        if not finite.all():
            self.last_info = {"passed": np.flatnonzero(~finite).tolist()}
        return reductions.group_means(G.numpy(), groups)
