"""MDA, SMEA, CAF and centered clipping against brute-force references, their
preconditions and caps, and their handling of rows holding NaN or infinity."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from common.learn.rules import RuleError, make_rule
from common.learn.rules.caf import caf_weights
from common.learn.rules.mda import MAX_SUBSETS as MDA_CAP
from common.learn.rules.smea import MAX_SUBSETS as SMEA_CAP


def matrix(n: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def run(name: str, X: np.ndarray, q: int, **options) -> tuple[np.ndarray, dict]:
    rule = make_rule(name, X.shape[0], q, **options)
    G = torch.from_numpy(X)
    before = G.clone()
    out = rule(G)
    assert out.dtype == torch.float32 and out.shape == (X.shape[1],)
    assert torch.equal(G.view(torch.int32), before.view(torch.int32)), "G was modified"
    json.dumps(rule.last_info, allow_nan=False)  # the server logs it as JSON
    return out.numpy(), rule.last_info


# ------------------------------------------------------------------ references


def distances(X: np.ndarray) -> np.ndarray:
    Y = X.astype(np.float64)
    return np.sqrt(((Y[:, None, :] - Y[None, :, :]) ** 2).sum(-1))


def ref_mda(X: np.ndarray, q: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """Every subset of n - q rows; the first with the smallest diameter."""
    D = distances(X)
    best, chosen = math.inf, ()
    for S in itertools.combinations(range(X.shape[0]), X.shape[0] - q):
        diameter = max((D[i, j] for i, j in itertools.combinations(S, 2)), default=0.0)
        if diameter < best:
            best, chosen = diameter, S
    return X[list(chosen)].astype(np.float64).mean(0), chosen


def top_eigenvalue(Y: np.ndarray) -> float:
    Y = Y.astype(np.float64) - Y.astype(np.float64).mean(0)
    return float(np.linalg.eigvalsh(Y.T @ Y / Y.shape[0])[-1])


def ref_smea(X: np.ndarray, q: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """Every subset of n - q rows; the first whose covariance (d x d, explicit) has the
    smallest top eigenvalue."""
    best, chosen = math.inf, ()
    for S in itertools.combinations(range(X.shape[0]), X.shape[0] - q):
        lam = top_eigenvalue(X[list(S)])
        if lam < best:
            best, chosen = lam, S
    return X[list(chosen)].astype(np.float64).mean(0), chosen


def ref_caf(X: np.ndarray, f: int) -> np.ndarray:
    """CAF in the d-dimensional space itself: explicit weighted covariance and eigh."""
    Y = X.astype(np.float64)
    n = Y.shape[0]
    c = np.ones(n)
    best_mu, best_lam = Y.mean(0), math.inf
    while True:
        mu = (c[:, None] * Y).sum(0) / c.sum()
        diffs = Y - mu
        sigma = (c[:, None, None] * diffs[:, :, None] * diffs[:, None, :]).sum(0) / c.sum()
        values, vectors = np.linalg.eigh(sigma)
        if values[-1] < best_lam:
            best_mu, best_lam = mu, values[-1]
        if not c.sum() > n - 2 * f:
            break
        tau = (diffs @ vectors[:, -1]) ** 2
        tau_max = tau[c > 0].max()
        c = c * np.clip(1 - tau / tau_max, 0, 1)
        c[tau == tau_max] = 0
        if not c.sum() > n - 2 * f:
            break
    return best_mu


def ref_cc(X: np.ndarray, v: np.ndarray, tau: float, iters: int) -> np.ndarray:
    Y, v = X.astype(np.float64), v.astype(np.float64)
    for _ in range(iters):
        diff = Y - v
        norm = np.sqrt((diff**2).sum(1))
        scale = np.minimum(1.0, tau / np.maximum(norm, 1e-300))
        v = v + (diff * scale[:, None]).mean(0)
    return v


# ------------------------------------------------------------------ matches

CASES = [(n, q) for n in (1, 2, 3, 5, 7, 9) for q in range(0, (n + 1) // 2)]


@pytest.mark.parametrize(("n", "q"), CASES)
def test_mda_matches_enumeration(n: int, q: int) -> None:
    X = matrix(n, 6, seed=100 * n + q)
    out, info = run("mda", X, q)
    ref, chosen = ref_mda(X, q)
    assert info["selected"] == list(chosen)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("n", "q"), CASES)
def test_smea_matches_enumeration(n: int, q: int) -> None:
    X = matrix(n, 5, seed=200 * n + q)
    out, info = run("smea", X, q)
    ref, chosen = ref_smea(X, q)
    assert info["selected"] == list(chosen)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert info["max_eigenvalue"] == pytest.approx(top_eigenvalue(X[list(chosen)]), rel=1e-6)


def test_smea_and_mda_exclude_a_far_cluster() -> None:
    X = matrix(9, 4, seed=3)
    X[[2, 5, 7]] += 50.0  # q = 3 rows far away, close to each other
    for name in ("mda", "smea"):
        _, info = run(name, X, 3)
        assert info["selected"] == [0, 1, 3, 4, 6, 8], name


@pytest.mark.parametrize(("n", "q", "d"), [(1, 0, 3), (3, 1, 2), (5, 2, 3), (7, 3, 4),
                                            (9, 2, 12), (10, 4, 5), (20, 8, 6)])
def test_caf_matches_the_d_dimensional_definition(n: int, q: int, d: int) -> None:
    X = matrix(n, d, seed=n * d + q)
    out, info = run("caf", X, q)
    np.testing.assert_allclose(out, ref_caf(X, q), rtol=1e-5, atol=1e-5)
    assert 1 <= info["iterations"] <= n


def test_caf_with_q_zero_is_the_mean() -> None:
    X = matrix(6, 4, seed=1)
    out, info = run("caf", X, 0)
    np.testing.assert_allclose(out, X.astype(np.float64).mean(0), rtol=1e-6)
    assert info["iterations"] == 1


def test_caf_removes_far_rows() -> None:
    X = matrix(10, 5, seed=4)
    X[[0, 3, 9]] = 1e6 * np.sign(matrix(3, 5, seed=5))
    out, info = run("caf", X, 3)
    weights = np.array(info["weights"])
    assert weights[[0, 3, 9]].sum() == 0.0
    honest = np.delete(X, [0, 3, 9], axis=0)
    assert np.all(out >= honest.min(0) - 1e-6) and np.all(out <= honest.max(0) + 1e-6)


def test_caf_weights_of_identical_rows_stop_at_once() -> None:
    K = np.ones((4, 4))  # four identical rows: zero covariance
    a, lam, iterations = caf_weights(K, 1)
    assert lam == 0.0 and iterations == 1 and np.allclose(a, 0.25)


@pytest.mark.parametrize(("tau", "iters"), [(100.0, 1), (0.5, 1), (0.5, 3), (2.0, 5)])
def test_centered_clipping_matches_the_formula_and_carries_its_center(tau: float,
                                                                       iters: int) -> None:
    rule = make_rule("centered-clipping", 7, 2, tau=tau, iters=iters)
    v = np.zeros(11)
    for t in range(4):
        X = matrix(7, 11, seed=t) + t
        out = rule(torch.from_numpy(X)).numpy()
        v = ref_cc(X, v, tau, iters)
        np.testing.assert_allclose(out, v, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(rule.get_state()["center"], out)
        v = out.astype(np.float64)  # the state is the float32 output


def test_centered_clipping_state_round_trip() -> None:
    a = make_rule("centered-clipping", 5, 0, tau=1.0)
    X = matrix(5, 8, seed=9)
    a(torch.from_numpy(X))
    b = make_rule("centered-clipping", 5, 0, tau=1.0)
    b.set_state(a.get_state())
    np.testing.assert_array_equal(a(torch.from_numpy(X)).numpy(), b(torch.from_numpy(X)).numpy())
    with pytest.raises(RuleError, match="unknown entries"):
        b.set_state({"momentum": np.zeros(8, dtype=np.float32)})
    b.set_state({"center": np.zeros(3, dtype=np.float32)})
    with pytest.raises(RuleError, match="holds 3 values, the input has d=8"):
        b(torch.from_numpy(X))


def test_centered_clipping_bounds_each_row_move() -> None:
    X = matrix(6, 4, seed=2)
    X[0] = 1e30  # clipped to norm tau around the center (zero): moves the output <= tau/n
    out, info = run("centered-clipping", X, 0, tau=1.0)
    honest = ref_cc(X[1:], np.zeros(4), 1.0, 1) * 5 / 6
    assert np.linalg.norm(out - honest) <= 1.0 / 6 + 1e-6
    assert info["clipped"] >= 1 and info["skipped"] == 0  # row 0 at least


def test_stateless_rules_refuse_a_state() -> None:
    with pytest.raises(RuleError, match="keeps no state"):
        make_rule("mda", 5, 1).set_state({"center": np.zeros(2)})
    make_rule("mda", 5, 1).set_state({})


# ------------------------------------------------------------------ non-finite rows

BAD = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("name", ["mda", "smea", "caf", "centered-clipping"])
@pytest.mark.parametrize("bad", BAD)
def test_rows_with_nonfinite_values_are_never_averaged(name: str, bad: float) -> None:
    X = matrix(7, 5, seed=11)
    X[1, 2] = bad
    X[4, 0] = bad
    out, info = run(name, X, 2)
    assert np.isfinite(out).all()
    if "selected" in info:
        assert 1 not in info["selected"] and 4 not in info["selected"]
    if name == "caf":
        assert info["weights"][1] == info["weights"][4] == 0.0
    if name == "centered-clipping":
        assert info["skipped"] == 2


@pytest.mark.parametrize("name", ["mda", "smea"])
def test_too_few_finite_rows_average_the_finite_ones(name: str) -> None:
    X = matrix(5, 3, seed=12)
    X[[0, 1, 2]] = np.nan  # q = 1: n - q = 4 rows wanted, 2 finite
    out, info = run(name, X, 1)
    assert info["fallback"] == "finite-rows" and info["selected"] == [3, 4]
    np.testing.assert_allclose(out, X[3:].astype(np.float64).mean(0), rtol=1e-6)


@pytest.mark.parametrize("name", ["mda", "smea", "caf"])
def test_no_finite_row_falls_back_to_marmed(name: str) -> None:
    X = np.full((5, 3), np.inf, dtype=np.float32)
    X[[1, 3], :] = -np.inf
    X[2, 1] = np.nan
    _, info = run(name, X, 1)
    assert info["fallback"] == "marmed"


def test_centered_clipping_without_a_finite_row_keeps_its_center() -> None:
    rule = make_rule("centered-clipping", 3, 0)
    rule.set_state({"center": np.array([1.0, 2.0], dtype=np.float32)})
    out = rule(torch.full((3, 2), np.nan)).numpy()
    np.testing.assert_array_equal(out, [1.0, 2.0])


def test_huge_finite_rows_do_not_overflow() -> None:
    X = matrix(7, 4, seed=13)
    X[0] = 3.4e38
    X[5] = -3.4e38
    for name in ("mda", "smea", "caf", "centered-clipping"):
        out, _ = run(name, X, 2)
        assert np.isfinite(out).all() and np.abs(out).max() < 1e3, name


# ------------------------------------------------------------------ preconditions


@pytest.mark.parametrize(
    ("name", "n", "q", "options", "message"),
    [
        ("mda", 10, 5, {}, r"mda needs 2q < n, C\(n,q\) <= 1e6, got n=10, q=5"),
        ("smea", 4, 2, {}, r"smea needs 2q < n.*got n=4, q=2"),
        ("caf", 6, 3, {}, r"caf needs 2q < n, got n=6, q=3"),
        ("mda", 30, 12, {}, rf"C\(30, 12\) = 86493225 .*capped at {MDA_CAP} \(n=30, q=12\)"),
        ("smea", 22, 10, {}, rf"C\(22, 10\) = 646646 .*capped at {SMEA_CAP} \(n=22, q=10\)"),
        ("centered-clipping", 5, 1, {"tau": 0}, "tau must be a positive number"),
        ("centered-clipping", 5, 1, {"tau": math.inf}, "tau must be a positive number"),
        ("centered-clipping", 5, 1, {"iters": 0}, "iters must be >= 1, got 0"),
        ("centered-clipping", 5, 1, {"iters": 1.5}, "must be an integer"),
        ("centered-clipping", 5, 5, {}, "needs 0 <= q < n, got n=5, q=5"),
        ("mda", 5, 1, {"m": 2}, "unknown option"),
    ],
)
def test_preconditions_and_caps(name: str, n: int, q: int, options: dict, message: str) -> None:
    with pytest.raises(RuleError, match=message):
        make_rule(name, n, q, **options)


def test_the_papers_setting_is_within_the_caps() -> None:
    assert math.comb(20, 8) <= SMEA_CAP <= MDA_CAP
    for name in ("mda", "smea", "caf", "centered-clipping"):
        make_rule(name, 20, 8)
