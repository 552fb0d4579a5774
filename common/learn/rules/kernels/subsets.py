"""Exhaustive searches over the subsets of m rows (MDA, SMEA): depth-first in
lexicographic order, a partial subset whose diameter already rules it out not extended."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _search(K, D2, m, eigen, rtol):
    """The first subset (in lexicographic order) of ``m`` rows that minimises the
    squared diameter (``eigen`` False), or the largest eigenvalue of the rows' scatter
    matrix (``eigen`` True; ``K`` their Gram matrix), by depth-first search with pruning.
    A later subset replaces the best one only if its value is below ``best - rtol *
    |best|`` (within that margin the two tie, and the earlier wins: eigenvalue rounding
    cannot break the documented tie-break).

    A partial subset whose diameter already reaches the best is not extended (for the
    eigenvalue: for rows i, j of a partial subset P, lambda_max(scatter(P)) >=
    ||x_i - x_j||^2 / 2, and the scatter only grows in the PSD order as rows are added);
    a complete one is first tested with a Cholesky factorisation (is every eigenvalue
    below the best?) and only then solved.  Returns (rows, best value, search nodes
    visited or eigenproblems solved).
    """
    k = D2.shape[0]
    best = np.inf
    bar = np.inf  # what a subset must beat: best, less the tie margin
    best_set = np.arange(m)
    idx = np.empty(m, dtype=np.int64)
    diam = np.zeros(m + 1)
    C = np.empty((m, m)) if eigen else np.empty((0, 0))
    L = np.empty((m, m)) if eigen else np.empty((0, 0))
    bound = 0.5 if eigen else 1.0
    count = 0
    t = 0
    idx[0] = -1
    while t >= 0:
        idx[t] += 1
        if idx[t] > k - (m - t):
            t -= 1
            continue
        if not eigen:
            count += 1
        c = idx[t]
        dd = diam[t]
        for u in range(t):
            x = D2[idx[u], c]
            if x > dd:
                dd = x
        if bound * dd >= bar:  # no completion can be strictly better
            continue
        if t == m - 1:
            if not eigen:
                best = dd
                bar = best - rtol * abs(best)
                best_set[:] = idx
                continue
            _centered_gram(K, idx, C)
            if bar < np.inf and not _all_below(C, bar, L):
                continue
            count += 1
            lam = np.linalg.eigvalsh(C)[m - 1]
            if lam < bar:
                best = lam
                bar = best - rtol * abs(best)
                best_set[:] = idx
            continue
        diam[t + 1] = dd
        t += 1
        idx[t] = idx[t - 1]
    return best_set, best, count


def min_diameter_subset(D2: np.ndarray, m: int) -> tuple[np.ndarray, float, int]:
    """(rows, squared diameter, search nodes visited) of the first subset of ``m`` rows
    in lexicographic order with the smallest diameter; ``D2`` finite squared distances."""
    D2 = np.ascontiguousarray(D2, dtype=np.float64)
    return _search(D2, D2, int(m), False, 0.0)


@numba.njit(cache=True, nogil=True)
def _centered_gram(K, idx, C):
    """``C`` = the centered Gram matrix H K[idx, idx] H of the rows ``idx`` (H = I - 11^T/m):
    its eigenvalues are those of their scatter matrix sum_i (x_i - mean)(x_i - mean)^T."""
    m = idx.shape[0]
    total = 0.0
    for a in range(m):
        s = 0.0
        for b in range(m):
            C[a, b] = K[idx[a], idx[b]]
            s += C[a, b]
        total += s
    total /= m * m
    for a in range(m):
        s = 0.0
        for b in range(m):
            s += C[a, b]
        ra = s / m
        for b in range(m):
            C[a, b] -= ra
    for b in range(m):
        s = 0.0
        for a in range(m):
            s += C[a, b]
        rb = s / m - total
        for a in range(m):
            C[a, b] -= rb + total
    for a in range(m):  # exactly symmetric for the eigensolver
        for b in range(a):
            x = 0.5 * (C[a, b] + C[b, a])
            C[a, b] = x
            C[b, a] = x


@numba.njit(cache=True, nogil=True)
def _all_below(C, bound, L):
    """Whether every eigenvalue of the symmetric ``C`` is below ``bound``: a Cholesky
    factorisation of bound*I - C (in ``L``) succeeds. Far cheaper than the eigenvalues."""
    m = C.shape[0]
    for j in range(m):
        s = bound - C[j, j]
        for k in range(j):
            s -= L[j, k] * L[j, k]
        if not s > 0.0:
            return False
        ljj = np.sqrt(s)
        L[j, j] = ljj
        for i in range(j + 1, m):
            t = -C[i, j]
            for k in range(j):
                t -= L[i, k] * L[j, k]
            L[i, j] = t / ljj
    return True


def min_eigen_subset(K: np.ndarray, D2: np.ndarray, m: int,
                     rtol: float = 0.0) -> tuple[np.ndarray, float, int]:
    """(rows, largest eigenvalue of their scatter matrix, eigenproblems solved) of
    the first subset of ``m`` rows in lexicographic order minimising that eigenvalue, a
    later subset replacing the best only if below it by more than ``rtol`` of it; ``K``
    the rows' (finite) Gram matrix and ``D2`` their squared distances."""
    return _search(np.ascontiguousarray(K, dtype=np.float64),
                   np.ascontiguousarray(D2, dtype=np.float64), int(m), True, float(rtol))
