"""MDA, minimum-diameter averaging: the mean of the n - q rows with the smallest diameter.

El Mhamdi, Guerraoui, Guirguis, Hoang, Rouault, "Genuinely Distributed Byzantine
Machine Learning" (PODC 2020), the reference ByzFL gives; the issue cites El Mhamdi et
al. 2018, whose "Brute" rule ("The Hidden Vulnerability of Distributed Learning in
Byzantium", ICML 2018) is, as we read it, the same selection.  Definition (ByzFL's):
``S* = argmin_{|S| = n-q} max_{i,j in S} ||x_i - x_j||``, output
``(1/(n-q)) sum_{i in S*} x_i``.  Needs 2q < n: the chosen subset then shares at least
n - 2q >= 1 row with the honest ones, so every row averaged lies within the honest
diameter of an honest row.

Exhaustive: the search (``kernels.min_diameter_subset``, depth-first over the subsets in
lexicographic order, a partial subset whose diameter already reaches the best one is
not extended) may visit all C(n, q) subsets, so a configuration with C(n, q) above
``MAX_SUBSETS`` (10^6; n = 20, q = 8 is 125,970) is refused when it is checked.  Ties
go to the lexicographically first subset.  Distances come from one float64 Gram matrix
(``kernels.gram64``), the mean is accumulated in float64.

Non-finite values: a row holding any NaN or infinity is at +inf from every row, so it
is never chosen while n - q finite rows exist; with fewer, the output is the mean of
the finite rows (``last_info["fallback"] = "finite-rows"``), and with none the
coordinate-wise median (MarMed, ``"marmed"``), as Krum and GeoMed do (NaN where every
row is NaN, see ``common.learn.rules.base``).
``last_info``: ``{"selected", "diameter"}``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from common.learn.rules.base import Rule, check_subsets, median_bound, register_rule
from common.learn.rules.marmed import coordinate_median

if TYPE_CHECKING:
    import torch

MAX_SUBSETS = 1_000_000


def subset_mean(G: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """The mean of rows ``rows`` of ``G``, accumulated in float64 (no copy of the rows)."""
    from common.learn.rules.kernels import reductions

    return reductions.group_means(G.numpy(), [np.asarray(rows, dtype=np.int64)])[0]


class SubsetMean(Rule):
    """Base of MDA and SMEA: the mean of the n - q finite rows an exhaustive search
    selects (``select``), with their non-finite fallbacks; needs 2q < n and C(n, q) at
    most ``max_subsets``."""

    max_subsets: ClassVar[int]
    precondition = staticmethod(lambda n, q: q <= median_bound(n))

    @classmethod
    def check(cls, n: int, q: int, **options: Any) -> dict[str, Any]:
        options = super().check(n, q, **options)
        check_subsets(cls.name, n, q, cls.max_subsets)
        return options

    def aggregate(self, G: torch.Tensor) -> torch.Tensor | np.ndarray:
        from common.learn.rules.kernels import gram

        K = gram.gram64(G)
        D2, finite = gram.squared_distances(K)
        rows = np.flatnonzero(finite)
        m = self.n - self.q
        if rows.size == 0:
            self.last_info = {"selected": [], "fallback": "marmed"}
            return coordinate_median(G)
        if rows.size < m:
            self.last_info = {"fallback": "finite-rows"}
        sub = np.ix_(rows, rows)
        chosen, info = self.select(K[sub], D2[sub], m)
        self.last_info = {**self.last_info, "selected": rows[chosen].tolist(), **info}
        return subset_mean(G, rows[chosen])

    def select(self, K: np.ndarray, D2: np.ndarray,
               m: int) -> tuple[np.ndarray, dict[str, float]]:
        """(positions of the chosen rows, what ``last_info`` reports of them) among k
        finite rows with Gram matrix ``K`` and squared distances ``D2``; all k rows if
        k <= m."""
        raise NotImplementedError


@register_rule
class MDA(SubsetMean):
    """Exhaustive minimum-diameter subset of n - q rows, then its mean."""

    name = "mda"
    summary = "mean of the n-q inputs with the smallest diameter (exhaustive search)"
    needs = "2q < n, C(n,q) <= 1e6"
    max_subsets = MAX_SUBSETS

    def select(self, K: np.ndarray, D2: np.ndarray,
               m: int) -> tuple[np.ndarray, dict[str, float]]:
        from common.learn.rules.kernels import subsets

        if K.shape[0] <= m:
            return np.arange(K.shape[0]), {"diameter": float(np.sqrt(D2.max()))}
        subset, diam2, _ = subsets.min_diameter_subset(D2, m)
        return subset, {"diameter": math.sqrt(diam2)}
