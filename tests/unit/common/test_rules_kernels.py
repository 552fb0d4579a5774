"""Unit tests of common/learn/rules/kernels/: networks, pruning, both kernel shapes, threads,
the NaN convention, the Gram distances and the subset searches."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from common.learn.rules.kernels import gram, subsets
from common.learn.rules.kernels import networks as K
from common.learn.rules.kernels.threads import MIN_COLUMNS_PER_THREAD

HALF = np.float32(0.5)


def zero_one_inputs(n: int) -> np.ndarray:
    return np.array(list(itertools.product([0, 1], repeat=n)), dtype=np.int64)


@pytest.mark.parametrize("n", range(1, 13))
def test_merge_exchange_sorts_every_zero_one_input(n: int) -> None:
    # the 0-1 principle: a comparator network sorting all 0/1 inputs sorts everything
    v = zero_one_inputs(n).T.copy()
    for a, b in K.merge_exchange(n):
        v[a], v[b] = np.minimum(v[a], v[b]), np.maximum(v[a], v[b])
    assert np.all(np.diff(v, axis=0) >= 0)


def run_program(prog: K.ScratchProgram, X: np.ndarray) -> np.ndarray:
    """Interpret the scratch ops on the columns of X; return (n, d) with dead rows NaN."""
    n = X.shape[0]
    S = np.full((n + 2, X.shape[1]), np.nan)
    S[:n] = X
    for a, b, lo, hi in prog.ops:
        x, y = S[a].copy(), S[b].copy()
        if lo >= 0:
            S[lo] = np.minimum(x, y)
        if hi >= 0:
            S[hi] = np.maximum(x, y)
    return np.array([S[r] if r >= 0 else np.full(X.shape[1], np.nan) for r in prog.final])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 16, 20, 33])
def test_pruned_programs_keep_what_is_read(n: int) -> None:
    rng = np.random.default_rng(n)
    X = rng.integers(-5, 6, size=(n, 500)).astype(np.float64)
    s = np.sort(X, axis=0)
    lo, hi = (n - 1) // 2, n // 2
    out = run_program(K.scratch_program(n, K.median_labels(n)), X)
    np.testing.assert_array_equal(out[lo] + out[hi], s[lo] + s[hi])
    for m in range(1, n + 1):
        out = run_program(K.scratch_program(n, K.window_labels(n, m)), X)
        p = n - m
        exact = [j for j in range(n) if j < p or j >= m] + ([lo] if lo == hi else [])
        np.testing.assert_array_equal(out[exact], s[exact])
        np.testing.assert_array_equal(out[lo] + out[hi], s[lo] + s[hi])
        np.testing.assert_array_equal(out[p:m].sum(0), s[p:m].sum(0))
    assert len(K.prune(n, K.median_labels(n))) <= len(K.merge_exchange(n))


def test_median_pruning_saves_comparators() -> None:
    assert len(K.merge_exchange(20)) == 97
    assert len(K.prune(20, K.median_labels(20))) == 80


def ref_window(col: np.ndarray, m: int) -> float:
    s = np.sort(col)
    n = s.size
    med = s[(n - 1) // 2] * HALF + s[n // 2] * HALF
    dist = np.abs(s - med)
    keep = sorted(range(n), key=lambda j: (dist[j], s[j]))[:m]
    return float(np.mean(s[keep].astype(np.float64)))


@pytest.mark.parametrize("n", [K.REGISTER_MAX_N + 1, K.REGISTER_MAX_N + 3])
def test_scratch_kernels_for_large_n(n: int) -> None:
    rng = np.random.default_rng(n)
    width = K.tile_width(n)
    for d in (1, width + 5, 3 * width - 1):
        X = rng.integers(-4, 5, size=(n, d)).astype(np.float32)
        s = np.sort(X, axis=0)
        np.testing.assert_array_equal(
            K.coordinate_median(X), s[(n - 1) // 2] * HALF + s[n // 2] * HALF
        )
        for q in (0, 7, (n - 1) // 2):
            np.testing.assert_allclose(
                K.coordinate_trimmed_mean(X, q), s[q : n - q].mean(0), rtol=1e-6, atol=1e-6
            )
        for m in (1, n // 2 + 1, n - 5, n):
            ref = [ref_window(X[:, j], m) for j in range(d)]
            np.testing.assert_allclose(K.coordinate_window_mean(X, m), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [5, K.REGISTER_MAX_N + 1])
def test_nan_becomes_plus_inf_on_even_rows_and_minus_inf_on_odd_rows(n: int) -> None:
    X = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    X[0, 0] = X[2, 0] = math.nan  # -> +inf, +inf: the median moves up
    X[1, 1] = X[3, 1] = math.nan  # -> -inf, -inf: the median moves down
    mapped = np.where(np.isnan(X), np.where(np.arange(n)[:, None] % 2 == 0, np.inf, -np.inf), X)
    s = np.sort(mapped, axis=0)
    median = s[(n - 1) // 2] * HALF + s[n // 2] * HALF
    np.testing.assert_array_equal(K.coordinate_median(X), median)
    np.testing.assert_allclose(K.coordinate_trimmed_mean(X, 2), s[2 : n - 2].mean(0), rtol=1e-6)


def test_rows_select_and_order_the_aggregated_rows() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((9, 70)).astype(np.float32)
    rows = np.array([8, 2, 5, 0, 7])
    np.testing.assert_array_equal(K.coordinate_median(X, rows), K.coordinate_median(X[rows]))
    np.testing.assert_array_equal(
        K.coordinate_window_mean(X, 3, rows), K.coordinate_window_mean(X[rows], 3)
    )


def test_threaded_chunks_match_one_thread() -> None:
    threads = torch.get_num_threads()
    rng = np.random.default_rng(2)
    X = rng.standard_normal((7, 2 * MIN_COLUMNS_PER_THREAD + 999)).astype(np.float32)
    X[3, -1] = math.nan
    try:
        torch.set_num_threads(3)
        many = [
            K.coordinate_median(X),
            K.coordinate_window_mean(X, 4),
            K.coordinate_trimmed_mean(X, 2),
        ]
        torch.set_num_threads(1)
        one = [
            K.coordinate_median(X),
            K.coordinate_window_mean(X, 4),
            K.coordinate_trimmed_mean(X, 2),
        ]
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(many, one, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(one[0][:-1], np.median(X[:, :-1], axis=0))


def test_generated_kernels_are_written_once_and_reused() -> None:
    kernel = K.generated_kernel(3, "median", 3)
    assert K.generated_kernel(3, "median", 3) is kernel
    path = kernel.py_func.__code__.co_filename
    with open(path) as f:
        assert f.read() == K.generated_source(3, "median", 3)
    assert "do not edit" in K.generated_source(3, "median", 3)


def test_squared_distances_from_gram() -> None:
    rng = np.random.default_rng(3)
    G = torch.from_numpy(rng.standard_normal((5, 40)).astype(np.float32))
    G[1] = 3e38
    G[3, 7] = math.nan
    D2, finite = gram.squared_distances(gram.gram64(G))
    X = G.numpy().astype(np.float64)
    assert finite.tolist() == [True, True, True, False, True]
    for i, j in itertools.product([0, 1, 2, 4], repeat=2):
        ref = np.sum((X[i] - X[j]) ** 2)
        assert D2[i, j] == pytest.approx(ref, rel=1e-9, abs=1e-9)
    assert np.all(D2[3] == np.inf) and np.all(D2[:, 3] == np.inf)


def _points(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The float64 Gram matrix and squared distances of n random rows (no ties)."""
    rng = np.random.default_rng(seed)
    K64 = gram.gram64(torch.from_numpy(rng.standard_normal((n, 6)).astype(np.float32)))
    return K64, gram.squared_distances(K64)[0]


@pytest.mark.parametrize(("seed", "n", "m"), [(0, 7, 4), (1, 9, 6), (2, 8, 1), (3, 6, 6)])
def test_subset_searches_find_what_trying_every_subset_finds(seed: int, n: int, m: int) -> None:
    K64, D2 = _points(seed, n)
    every = [np.array(c) for c in itertools.combinations(range(n), m)]
    diameters = [D2[np.ix_(c, c)].max() for c in every]
    best = every[int(np.argmin(diameters))]
    rows, diameter, visited = subsets.min_diameter_subset(D2, m)
    assert rows.tolist() == best.tolist() and diameter == min(diameters)
    assert visited > 0
    centred = [np.linalg.eigvalsh(np.cov(_rows(K64, c), rowvar=False, bias=True) * m)[-1]
               if m > 1 else 0.0 for c in every]
    rows, top, solved = subsets.min_eigen_subset(K64, D2, m)
    assert rows.tolist() == every[int(np.argmin(centred))].tolist()
    assert top == pytest.approx(min(centred), rel=1e-6, abs=1e-9) and 0 < solved <= len(every)


def _rows(K64: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Points with Gram matrix ``K64[rows, rows]`` (any rotation: the scatter's
    eigenvalues do not depend on it)."""
    w, v = np.linalg.eigh(K64[np.ix_(rows, rows)])
    return v * np.sqrt(np.maximum(w, 0.0))
