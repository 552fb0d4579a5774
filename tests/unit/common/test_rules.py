"""Unit tests of common/rules: every rule against a brute-force reference, the registry,
preconditions, input checks and non-finite handling of the distance-based rules."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from common.learn.rules import RULES, RuleError, make_rule, rule_names

# n values of the reference sweeps, even and odd (each n compiles its own kernels once).
NS = [1, 2, 3, 4, 5, 6, 7, 10, 20, 21]
DS = [1, 3, 67, 300]  # 67 and 300: no multiple of any tile or vector width
HALF = np.float32(0.5)


def matrix(n: int, d: int, seed: int, ties: bool = False) -> torch.Tensor:
    """Gaussian (n, d) float32 matrix; integer-valued in -3..3 (many ties) if ``ties``."""
    rng = np.random.default_rng(seed)
    if ties:
        return torch.from_numpy(rng.integers(-3, 4, size=(n, d)).astype(np.float32))
    return torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32))


def run(name: str, G: torch.Tensor, q: int, **options) -> tuple[np.ndarray, dict]:
    rule = make_rule(name, G.shape[0], q, **options)
    before = G.clone()
    out = rule(G)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert out.shape == (G.shape[1],)
    assert torch.equal(G.view(torch.int32), before.view(torch.int32)), "G was modified"
    json.dumps(rule.last_info, allow_nan=False)  # the server logs it as JSON
    return out.numpy(), rule.last_info


# ------------------------------------------------------------------ references


def ref_median(X: np.ndarray) -> np.ndarray:
    s = np.sort(X, axis=0)
    n = X.shape[0]
    return s[(n - 1) // 2] * HALF + s[n // 2] * HALF


def ref_window_mean(col: np.ndarray, m: int) -> float:
    """Mean of the m values nearest the median; float32 distances, ties keep the lower."""
    s = np.sort(col)
    n = s.size
    med = s[(n - 1) // 2] * HALF + s[n // 2] * HALF
    dist = np.abs(s - med)
    keep = sorted(range(n), key=lambda j: (dist[j], s[j]))[:m]
    return float(np.mean(s[keep].astype(np.float64)))


def ref_meamed(X: np.ndarray, q: int) -> np.ndarray:
    return np.array([ref_window_mean(X[:, j], X.shape[0] - q) for j in range(X.shape[1])])


def ref_trimmed(X: np.ndarray, q: int) -> np.ndarray:
    s = np.sort(X.astype(np.float64), axis=0)
    return s[q : X.shape[0] - q].mean(axis=0)


def sq_dists(X: np.ndarray) -> np.ndarray:
    X = X.astype(np.float64)
    n = X.shape[0]
    return np.array([[np.sum((X[i] - X[j]) ** 2) for j in range(n)] for i in range(n)])


def ref_krum_scores(X: np.ndarray, q: int) -> np.ndarray:
    D = sq_dists(X)
    n = X.shape[0]
    k = n - q - 2
    return np.array([sum(sorted(D[i, j] for j in range(n) if j != i)[:k]) for i in range(n)])


def ref_bulyan(X: np.ndarray, q: int) -> tuple[list[int], np.ndarray]:
    D = sq_dists(X)
    n = X.shape[0]
    remaining = list(range(n))
    selected = []
    for _ in range(n - 2 * q):
        k = max(len(remaining) - q - 2, 0)
        scores = [sum(sorted(D[i, j] for j in remaining if j != i)[:k]) for i in remaining]
        best = remaining[int(np.argmin(scores))]
        selected.append(best)
        remaining.remove(best)
    beta = n - 4 * q
    S = X[selected]
    return selected, np.array([ref_window_mean(S[:, j], beta) for j in range(X.shape[1])])


def ref_geomed(X: np.ndarray, iters: int = 20000) -> np.ndarray:
    """Plain Weiszfeld on the vectors in float64, run long."""
    X = X.astype(np.float64)
    v = X.mean(axis=0)
    for _ in range(iters):
        w = 1.0 / np.maximum(np.linalg.norm(X - v, axis=1), 1e-12)
        v_new = w @ X / w.sum()
        if np.linalg.norm(v_new - v) < 1e-13 * (1 + np.linalg.norm(v)):
            return v_new
        v = v_new
    return v


def objective(X: np.ndarray, v: np.ndarray) -> float:
    return float(np.linalg.norm(X.astype(np.float64) - v, axis=1).sum())


# ------------------------------------------------------------ reference sweeps


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("ties", [False, True])
def test_mean_and_marmed_match_reference(n: int, ties: bool) -> None:
    for d in DS:
        G = matrix(n, d, seed=n * 100 + d, ties=ties)
        out, _ = run("mean", G, 0)
        np.testing.assert_allclose(out, G.numpy().astype(np.float64).mean(0), rtol=1e-5, atol=1e-6)
        out, info = run("marmed", G, 0)
        np.testing.assert_array_equal(out, ref_median(G.numpy()))
        assert info == {}


def qs(n: int) -> list[int]:
    """q values tested for the median-bounded rules: 0, 1 and the largest allowed."""
    return sorted({0, min(1, (n - 1) // 2), (n + 1) // 2 - 1})


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("ties", [False, True])
def test_meamed_and_trimmed_mean_match_reference(n: int, ties: bool) -> None:
    for q in qs(n):
        for d in DS:
            G = matrix(n, d, seed=n * 1000 + d + q, ties=ties)
            X = G.numpy()
            out, _ = run("meamed", G, q)
            np.testing.assert_allclose(out, ref_meamed(X, q), rtol=1e-5, atol=1e-6)
            out, _ = run("trimmed-mean", G, q)
            np.testing.assert_allclose(out, ref_trimmed(X, q), rtol=1e-5, atol=1e-6)


def test_meamed_ties_keep_the_lower_value() -> None:
    # median 0, values -1 and +1 equally far: the lower one is kept
    G = torch.tensor([[-1.0], [0.0], [1.0]])
    assert run("meamed", G, 1)[0][0] == np.float32(-0.5)
    # n = 4: median 1.5; 1 and 2 are nearest, then 0 and 3 tie -> 0 kept
    G = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    assert run("meamed", G, 1)[0][0] == np.float32(1.0)


@pytest.mark.parametrize("n", [n for n in NS if n >= 3])
@pytest.mark.parametrize("ties", [False, True])
def test_medoid_matches_reference(n: int, ties: bool) -> None:
    for d in (1, 67):
        G = matrix(n, d, seed=7 * n + d, ties=ties)
        X = G.numpy().astype(np.float64)
        sums = np.sqrt(sq_dists(X)).sum(axis=1)
        out, info = run("medoid", G, 0)
        (best,) = info["selected"]
        assert sums[best] == pytest.approx(sums.min(), rel=1e-9, abs=1e-9)
        if not ties:
            assert best == int(np.argmin(sums))
        np.testing.assert_array_equal(out, G[best].numpy())


@pytest.mark.parametrize("n", [4, 5, 6, 7, 10, 20, 21])
@pytest.mark.parametrize("ties", [False, True])
def test_krum_and_multikrum_match_reference(n: int, ties: bool) -> None:
    for q in range(0, (n - 3) // 2 + 1):
        G = matrix(n, 67, seed=31 * n + q, ties=ties)
        scores = ref_krum_scores(G.numpy(), q)
        out, info = run("krum", G, q)
        (best,) = info["selected"]
        assert scores[best] == pytest.approx(scores.min(), rel=1e-9, abs=1e-9)
        if not ties:
            assert best == int(np.argmin(scores))
        np.testing.assert_array_equal(out, G[best].numpy())
        for m in sorted({1, (n - q + 1) // 2, n - q}):
            out, info = run("multikrum", G, q, m=m)
            chosen = info["selected"]
            assert len(chosen) == len(set(chosen)) == m
            np.testing.assert_allclose(
                sorted(scores[chosen]), np.sort(scores)[:m], rtol=1e-9, atol=1e-9
            )
            if not ties:
                assert sorted(chosen) == sorted(np.argsort(scores, kind="stable")[:m].tolist())
            np.testing.assert_allclose(out, G.numpy()[chosen].mean(0), rtol=1e-6, atol=1e-6)


def test_multikrum_default_m_is_n_minus_q() -> None:
    G = matrix(10, 5, seed=3)
    rule = make_rule("multikrum", 10, 3)
    rule(G)
    assert len(rule.last_info["selected"]) == 7


@pytest.mark.parametrize(("n", "q"), [(3, 0), (4, 0), (7, 1), (8, 1), (11, 2), (20, 4), (21, 4)])
@pytest.mark.parametrize("ties", [False, True])
def test_bulyan_matches_reference(n: int, q: int, ties: bool) -> None:
    for d in (1, 67):
        G = matrix(n, d, seed=13 * n + d, ties=ties)
        selected, ref = ref_bulyan(G.numpy(), q)
        out, info = run("bulyan", G, q)
        assert len(info["selected"]) == n - 2 * q
        if not ties:
            assert info["selected"] == selected
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 10])
def test_geomed_matches_reference(n: int) -> None:
    for d in (1, 2, 5, 67):
        G = matrix(n, d, seed=17 * n + d)
        X = G.numpy()
        out, info = run("geomed", G, 0, tol=1e-9, max_iter=10000)
        assert info["converged"]
        ref = ref_geomed(X)
        spread = np.linalg.norm(X - X.mean(0), axis=1).mean()
        if n != 2 and (d > 1 or n % 2):  # else the median set is a whole segment
            assert np.linalg.norm(out - ref) <= 1e-4 * max(spread, 1e-12)
        assert objective(X, out) <= objective(X, ref) * (1 + 1e-6) + 1e-9


def test_geomed_symmetric_points_and_convergence_info() -> None:
    c = np.array([3.0, -2.0, 1.0], dtype=np.float32)
    points = np.concatenate([np.eye(3), -np.eye(3)]).astype(np.float32) * 5 + c
    out, info = run("geomed", torch.from_numpy(points), 0)
    np.testing.assert_allclose(out, c, atol=1e-5)
    assert info["converged"] and 0 <= info["iterations"] <= 100
    assert info["objective"] == pytest.approx(6 * 5, rel=1e-6)


def test_geomed_reports_non_convergence() -> None:
    G = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [7.0, 7.0]])
    _, info = run("geomed", G, 0, tol=1e-15, max_iter=1)
    assert info["iterations"] == 1 and info["converged"] is False


def test_geomed_resists_an_outlier_row() -> None:
    G = matrix(9, 40, seed=5)
    G[0] = 1e20
    out, _ = run("geomed", G, 0)
    assert np.abs(out).max() < 5


# -------------------------------------------------------------- non-finite values


def test_mean_propagates_nan_and_inf() -> None:
    G = matrix(5, 4, seed=1)
    G[2, 1] = math.nan
    G[3, 2] = math.inf
    out, _ = run("mean", G, 0)
    assert math.isnan(out[1]) and out[2] == math.inf
    assert np.isfinite(out[[0, 3]]).all()


@pytest.mark.parametrize("name", ["medoid", "krum", "multikrum", "geomed", "bulyan"])
def test_distance_rules_skip_rows_with_nonfinite_values(name: str) -> None:
    n, q = 11, 2
    G = matrix(n, 50, seed=2)
    G[1, 3] = math.nan
    G[4, 0] = math.inf
    G[7, 49] = -math.inf
    out, info = run(name, G, q)
    assert np.isfinite(out).all()
    if "selected" in info and name != "bulyan":
        assert not {1, 4, 7} & set(info["selected"])
    if name == "bulyan":  # 8 finite rows >= theta = 7: no bad row selected
        assert not {1, 4, 7} & set(info["selected"])


@pytest.mark.parametrize("name", ["medoid", "krum", "multikrum", "geomed"])
def test_distance_rules_pick_the_only_finite_row(name: str) -> None:
    G = matrix(7, 20, seed=3)
    G[[0, 1, 2, 4, 5, 6], 5] = math.nan
    out, _ = run(name, G, 1)
    np.testing.assert_array_equal(out, G[3].numpy())


@pytest.mark.parametrize("name", ["medoid", "krum", "multikrum", "geomed"])
def test_distance_rules_fall_back_to_marmed_without_finite_rows(name: str) -> None:
    G = matrix(7, 20, seed=4)
    G[np.arange(7), np.arange(7)] = math.nan  # every row has one NaN, each column <= 1
    out, info = run(name, G, 1)
    assert info["fallback"] == "marmed"
    np.testing.assert_array_equal(out, run("marmed", G, 1)[0])
    assert np.isfinite(out).all()


@pytest.mark.parametrize("value", [1e20, -1e20, 3e38, math.nan, math.inf])
def test_krum_and_medoid_pick_honest_rows_against_far_byzantine_rows(value: float) -> None:
    n, q = 12, 4
    G = matrix(n, 100, seed=8)
    byzantine = [0, 5, 6, 11]
    G[byzantine] = value
    for name in ("krum", "multikrum", "medoid"):
        _, info = run(name, G, q)
        assert not set(byzantine) & set(info["selected"]), name
    # two identical far rows are each other's nearest neighbour, so Bulyan's last Krum
    # rounds may select them; its coordinate phase still discards them
    G = matrix(11, 100, seed=9)
    G[[3, 8]] = value
    out, _ = run("bulyan", G, 2)
    assert np.abs(out).max() < 5


def test_gram_handles_huge_values_without_overflow() -> None:
    G = matrix(6, 1000, seed=9)
    G[2] = 3e38  # float32 squares overflow; the float64 Gram does not
    _, info = run("krum", G, 1)
    assert info["selected"][0] != 2 and math.isfinite(info["score"])


# ----------------------------------------------------- registry and preconditions


def test_registry_names() -> None:
    expected = [
        "bulyan",
        "caf",
        "centered-clipping",
        "geomed",
        "krum",
        "marmed",
        "mda",
        "meamed",
        "mean",
        "medoid",
        "multikrum",
        "smea",
        "trimmed-mean",
    ]
    assert rule_names() == expected == sorted(RULES)
    for name in expected:
        rule = make_rule(name, 20, 4)
        assert rule.name == name and rule.last_info == {}


def test_unknown_rule_lists_valid_names() -> None:
    with pytest.raises(RuleError, match=r"unknown rule 'median'.*krum.*trimmed-mean"):
        make_rule("median", 10, 1)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("mean", {"m": 3}, "unknown option.*mean: m; valid: none"),
        ("krum", {"tol": 1.0}, "unknown option.*krum: tol"),
        ("multikrum", {"m": 0}, "1 <= m <= n-q, got m=0, n=10, q=3"),
        ("multikrum", {"m": 8}, "1 <= m <= n-q, got m=8, n=10, q=3"),
        ("multikrum", {"m": 2.5}, "must be an integer"),
        ("geomed", {"tol": 0}, "tol must be a positive number"),
        ("geomed", {"eps": math.nan}, "eps must be a positive number"),
        ("geomed", {"max_iter": 0}, "max_iter must be >= 1"),
        ("geomed", {"max_iter": "7"}, "must be an integer"),
    ],
)
def test_bad_options(name: str, options: dict, message: str) -> None:
    with pytest.raises(RuleError, match=message):
        make_rule(name, 10, 3, **options)


@pytest.mark.parametrize(
    ("name", "n", "q", "message"),
    [
        ("krum", 10, 4, "krum needs 2q\\+2 < n, got n=10, q=4"),
        ("multikrum", 4, 1, "multikrum needs 2q\\+2 < n, got n=4, q=1"),
        ("krum", 2, 0, "krum needs 2q\\+2 < n, got n=2, q=0"),
        ("meamed", 10, 5, "meamed needs q <= ceil\\(n/2\\)-1, got n=10, q=5"),
        ("meamed", 9, 5, "meamed needs q <= ceil\\(n/2\\)-1, got n=9, q=5"),
        ("trimmed-mean", 6, 3, "trimmed-mean needs q <= ceil\\(n/2\\)-1.*got n=6, q=3"),
        ("bulyan", 10, 2, "bulyan needs n >= 4q\\+3, got n=10, q=2"),
        ("mean", 5, 5, "mean needs 0 <= q < n, got n=5, q=5"),
        ("marmed", 5, -1, "marmed needs 0 <= q < n, got n=5, q=-1"),
        ("geomed", 0, 0, "geomed needs n >= 1, got n=0, q=0"),
        ("medoid", 3, True, "q must be an integer"),
        ("medoid", 3.0, 0, "n must be an integer"),
    ],
)
def test_preconditions(name: str, n: int, q: int, message: str) -> None:
    with pytest.raises(RuleError, match=message):
        make_rule(name, n, q)
    assert issubclass(RuleError, ValueError)


@pytest.mark.parametrize(("name", "n", "q"), [("meamed", 9, 4), ("bulyan", 11, 2), ("krum", 5, 1)])
def test_largest_allowed_q_is_accepted(name: str, n: int, q: int) -> None:
    make_rule(name, n, q)(matrix(n, 3, seed=0))


@pytest.mark.parametrize("name", rule_names())
def test_bad_inputs(name: str) -> None:
    rule = make_rule(name, 7, 1)
    bad = [
        (torch.zeros(7, 4, dtype=torch.float64), "dtype float32"),
        (torch.zeros(7, 4, dtype=torch.float16), "dtype float32"),
        (torch.zeros(7), "2-D"),
        (torch.zeros(7, 4, 1), "2-D"),
        (torch.zeros(6, 4), "n=7 rows, got 6"),
        (torch.zeros(7, 0), "d=0"),
        (np.zeros((7, 4), dtype=np.float32), "torch.Tensor"),
    ]
    for G, message in bad:
        with pytest.raises(RuleError, match=message):
            rule(G)


@pytest.mark.parametrize("name", rule_names())
def test_non_contiguous_input_is_accepted(name: str) -> None:
    G = matrix(40, 7, seed=6).T  # (7, 40) view, not contiguous
    out = make_rule(name, 7, 1)(G)
    ref = make_rule(name, 7, 1)(G.contiguous())
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
