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
lexicographically first subset: the search keeps the subset it found first unless a
later one's eigenvalue is below it by more than ``TIE_RTOL`` (1e-9) of it, far more than
the rounding of a centred Gram matrix moves an eigenvalue while the rows' spread is not
tiny next to their norms (rows [-1], [1], [2], [-2] with q = 1: {0, 1, 2} and
{0, 1, 3} tie, so the output is 2/3, not -2/3).

Non-finite values: as MDA (``common.learn.rules.mda``): rows holding NaN or infinity are never
chosen while n - q finite rows exist; with fewer the output is the mean of the finite
rows, with none MarMed (NaN where every row is NaN, see ``common.learn.rules.base``).
``last_info``: ``{"selected", "max_eigenvalue"}`` (of the chosen subset's covariance,
normalised by |S|).
"""

from __future__ import annotations

import numpy as np

from common.learn.rules.base import register_rule
from common.learn.rules.mda import SubsetMean

MAX_SUBSETS = 200_000
TIE_RTOL = 1e-9


@register_rule
class SMEA(SubsetMean):
    """Exhaustive smallest-top-eigenvalue subset of n - q rows, then its mean."""

    name = "smea"
    summary = ("mean of the n-q inputs whose covariance has the smallest top eigenvalue "
               "(exhaustive search)")
    needs = "2q < n, C(n,q) <= 2e5"
    max_subsets = MAX_SUBSETS

    def select(self, K: np.ndarray, D2: np.ndarray,
               m: int) -> tuple[np.ndarray, dict[str, float]]:
        from common.learn.rules.kernels import subsets

        k = K.shape[0]
        if k <= m:
            top = float(np.linalg.eigvalsh(_centered(K))[-1])
            return np.arange(k), {"max_eigenvalue": top / k}
        subset, top, _ = subsets.min_eigen_subset(K, D2, m, TIE_RTOL)
        return subset, {"max_eigenvalue": float(top) / m}


def _centered(K: np.ndarray) -> np.ndarray:
    """H K H with H = I - 11^T/m: the Gram matrix of the rows minus their mean."""
    row = K.mean(axis=1, keepdims=True)
    return K - row - row.T + K.mean()
