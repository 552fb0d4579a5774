"""Gram-matrix distances for the distance-based rules (Medoid, Krum, Multi-Krum, GeoMed,
Bulyan, MDA, SMEA, CAF, NNM): one float64 Gram matrix ``G @ G.T`` gives all pairwise
distances."""

from __future__ import annotations

import numpy as np
import torch

_GRAM_CHUNK = 16384  # columns per float64 block of the Gram accumulation


def gram64(G: torch.Tensor) -> np.ndarray:
    """``G @ G.T`` accumulated in float64 over column blocks (one BLAS pass, no overflow).

    Squares of float32 values reach at most ~1.2e77, so the float64 Gram of any finite
    row is finite; a row with a NaN or an infinity gets a non-finite diagonal entry.
    """
    n, d = G.shape
    K = torch.zeros((n, n), dtype=torch.float64)
    for s in range(0, d, _GRAM_CHUNK):
        X = G[:, s : s + _GRAM_CHUNK].double()
        K.addmm_(X, X.T)
    return K.numpy()


def squared_distances(K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairwise squared Euclidean distances from a Gram matrix, and the finite-row mask.

    ``D2[i, j] = K[i, i] + K[j, j] - 2 K[i, j]``, clamped at 0 (rounding); 0 from a finite
    row to itself.  A row holding any non-finite value is at +inf from every row, itself
    included, so no selection ever prefers it to a finite row.
    """
    diag = np.diag(K).copy()
    finite = np.isfinite(diag)
    with np.errstate(invalid="ignore", over="ignore"):
        D2 = diag[:, None] + diag[None, :] - 2.0 * K
    D2 = np.maximum(D2, 0.0)
    np.fill_diagonal(D2, 0.0)
    D2[~finite, :] = np.inf
    D2[:, ~finite] = np.inf
    return D2, finite
