"""CAF, the covariance-bound agnostic filter.

Allouah, Guerraoui, Stephan, "Towards Trustworthy Federated Learning with Untrusted
Participants" (ICML 2025), Algorithm 2, as ByzFL documents and implements it (the issue
attributes CAF to Allouah et al. 2024, "Robust distributed learning: tight error bounds
and breakdown point under data heterogeneity"; the definition followed here is the
2025 paper's and ByzFL's).

With weights ``c_i = 1``, while ``sum_i c_i > n - 2q``:

* ``mu_c = sum_i c_i x_i / sum_i c_i`` and ``Sigma_c = sum_i c_i (x_i - mu_c)(x_i - mu_c)^T
  / sum_i c_i``; ``v``, ``lambda`` its top eigenvector and eigenvalue;
* ``tau_i = ((x_i - mu_c)^T v)^2`` and ``c_i <- c_i (1 - tau_i / max_j tau_j)``;

the output is the ``mu_c`` whose ``lambda`` was the smallest.  Needs 2q < n.

Where this differs from ByzFL, and why: the eigenpair is exact (ByzFL takes one step of
the power method from a random start, so its output is random); ``max_j tau_j`` is over
the rows still weighted (a row whose weight is already 0 could otherwise keep the
maximum, and the rows still weighted would barely move); and the starting weights are always
evaluated, so q = 0 gives the mean (ByzFL then returns nothing).  Each iteration zeroes
at least one weight, so there are at most n.

Everything runs on n x n matrices: with ``K = G G^T`` (float64, ``kernels.gram64``) and
``a = c / sum c``, the centered Gram matrix ``C = (I - 1a^T) K (I - a1^T)`` gives
``Sigma_c``'s nonzero eigenpairs from ``M = D^{1/2} C D^{1/2}`` (``D = diag(a)``):
``lambda = lambda_max(M)`` and ``(x_k - mu_c)^T v = (C D^{1/2} u)_k / sqrt(lambda)``.
The (d,) output is formed once, accumulated in float64.

Non-finite values: rows holding a NaN or an infinity are left out, counted as Byzantine
(the filter then runs on the m finite rows with q' = max(0, q - (n - m)), so
2q' < m still holds); with no finite row the output is MarMed
(``last_info["fallback"] = "marmed"``).  ``last_info``: ``{"iterations",
"max_eigenvalue", "weights"}`` (the chosen weights, per row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from common.learn.rules.base import Rule, median_bound, register_rule
from common.learn.rules.marmed import coordinate_median

if TYPE_CHECKING:
    import torch


def caf_weights(K: np.ndarray, f: int) -> tuple[np.ndarray, float, int]:
    """CAF on the rows whose Gram matrix is ``K`` tolerating ``f``: (the normalised weights
    of the output mean, its top covariance eigenvalue, iterations)."""
    m = K.shape[0]
    c = np.ones(m)
    best_a, best_lam = c / m, np.inf
    iterations = 0
    while True:
        a = c / c.sum()
        Ka = K @ a
        C = K - Ka[:, None] - Ka[None, :] + a @ Ka
        C = 0.5 * (C + C.T)
        root = np.sqrt(a)
        eigenvalues, vectors = np.linalg.eigh(root[:, None] * C * root[None, :])
        lam = max(float(eigenvalues[-1]), 0.0)
        iterations += 1
        if lam < best_lam:
            best_a, best_lam = a, lam
        if not c.sum() > m - 2 * f or lam == 0.0:
            break
        tau = (C @ (root * vectors[:, -1])) ** 2 / lam
        tau_max = tau[c > 0].max()
        if not tau_max > 0.0:
            break
        c = c * np.clip(1.0 - tau / tau_max, 0.0, 1.0)
        c[tau == tau_max] = 0.0  # exactly removed, whatever the rounding of 1 - 1
        if not c.sum() > m - 2 * f:
            # the loop of the definition stops here without evaluating these weights
            break
    return best_a, best_lam, iterations


@register_rule
class CAF(Rule):
    """Spectral filter: down-weights rows along the top covariance direction."""

    name = "caf"
    summary = "covariance-bound agnostic filter: down-weight along the top eigenvector"
    needs = "2q < n"
    precondition = staticmethod(lambda n, q: q <= median_bound(n))

    def aggregate(self, G: torch.Tensor) -> torch.Tensor | np.ndarray:
        from common.learn.rules.kernels import gram, reductions

        K = gram.gram64(G)
        rows = np.flatnonzero(np.isfinite(np.diag(K)))
        if rows.size == 0:
            self.last_info = {"iterations": 0, "fallback": "marmed"}
            return coordinate_median(G)
        f = max(0, self.q - (self.n - rows.size))
        a, lam, iterations = caf_weights(K[np.ix_(rows, rows)], f)
        weights = np.zeros(self.n)
        weights[rows] = a
        self.last_info = {"iterations": iterations, "max_eigenvalue": lam,
                          "weights": [round(float(w), 6) for w in weights]}
        X = G.numpy()
        return reductions.weighted_shift(X, np.zeros(X.shape[1], dtype=np.float32), rows, a)
