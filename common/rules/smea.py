"""SMEA, smallest maximum eigenvalue averaging: the mean of the n - q rows whose
empirical covariance has the smallest largest eigenvalue.

Allouah, Guerraoui, Gupta, Pinot, Stephan, "On the Privacy-Robustness-Utility Trilemma
in Distributed Learning" (ICML 2023), the reference ByzFL gives (the issue cites
Allouah et al. 2024), with ByzFL's definition:
``S* = argmin_{|S| = n-q} lambda_max((1/|S|) sum_{i in S} (x_i - mu_S)(x_i - mu_S)^T)``,
output ``mu_{S*}``.  Needs 2q < n (an honest majority, as the paper and ByzFL
require).  ByzFL estimates each eigenvalue by one step of the
power method from a random start; here it is exact, so the choice is deterministic.

Exhaustive: the eigenvalues of a subset's covariance are those of its centered Gram
matrix ((n-q) x (n-q), from one float64 Gram matrix ``kernels.gram64``), so after the
Gram matrix the cost does not depend on d.  The search (``kernels.min_eigen_subset``)
goes depth first over the subsets in lexicographic order and prunes with
``lambda_max >= max_{i,j} ||x_i - x_j||^2 / (2 |S|)`` (the scatter only grows as rows
are added) and a Cholesky test before each eigenproblem; in the worst case it still
meets all C(n, q) subsets, so a configuration with C(n, q) above ``MAX_SUBSETS``
(2 x 10^5; n = 20, q = 8 is 125,970) is refused when it is checked.  Ties go to the
lexicographically first subset.

Non-finite values: as MDA (``common.rules.mda``): rows holding NaN or infinity are never
chosen while n - q finite rows exist; with fewer the output is the mean of the finite
rows, with none MarMed.  ``last_info``: ``{"selected", "max_eigenvalue"}`` (of the
chosen subset's covariance, normalised by |S|).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from common.rules.base import Rule, check_subsets, median_bound, register_rule
from common.rules.marmed import coordinate_median
from common.rules.mda import subset_mean

if TYPE_CHECKING:
    import torch

MAX_SUBSETS = 200_000


@register_rule
class SMEA(Rule):
    """Exhaustive smallest-top-eigenvalue subset of n - q rows, then its mean."""

    name = "smea"
    summary = ("mean of the n-q inputs whose covariance has the smallest top eigenvalue "
               "(exhaustive search)")
    needs = "2q < n, C(n,q) <= 2e5"
    precondition = staticmethod(lambda n, q: q <= median_bound(n))

    @classmethod
    def check(cls, n: int, q: int, **options: Any) -> dict[str, Any]:
        options = super().check(n, q, **options)
        check_subsets(cls.name, n, q, MAX_SUBSETS)
        return options

    def aggregate(self, G: torch.Tensor) -> torch.Tensor | np.ndarray:
        from common.rules.kernels import gram, subsets

        K = gram.gram64(G)
        D2, finite = gram.squared_distances(K)
        rows = np.flatnonzero(finite)
        m = self.n - self.q
        if rows.size == 0:
            self.last_info = {"selected": [], "fallback": "marmed"}
            return coordinate_median(G)
        sub = np.ix_(rows, rows)
        if rows.size <= m:
            chosen = rows
            eigen = float(np.linalg.eigvalsh(_centered(K[sub]))[-1]) / rows.size
            if rows.size < m:
                self.last_info = {"fallback": "finite-rows"}
        else:
            subset, top, _ = subsets.min_eigen_subset(K[sub], D2[sub], m)
            chosen, eigen = rows[subset], float(top) / m
        self.last_info = {**self.last_info, "selected": chosen.tolist(), "max_eigenvalue": eigen}
        return subset_mean(G, chosen)


def _centered(K: np.ndarray) -> np.ndarray:
    """H K H with H = I - 11^T/m: the Gram matrix of the rows minus their mean."""
    row = K.mean(axis=1, keepdims=True)
    return K - row - row.T + K.mean()
