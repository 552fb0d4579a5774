"""Property tests of common/rules: robustness to Byzantine values (hypothesis).

Generalized Byzantine model (Xie, Koyejo, Gupta, ICML 2018): any values of the (n, d)
matrix may be arbitrary, at most a bounded number per coordinate.  NaN, +-Inf and huge
values are Byzantine values like any other.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from common.learn.rules import make_rule

# A few n values only: each compiles its kernels once (then cached on disk).
NS = [1, 2, 3, 4, 5, 6, 7, 10]
EXTREME = [math.nan, math.inf, -math.inf, 1e20, -1e20, 3.4e38, -3.4e38]
ARBITRARY = st.one_of(
    st.sampled_from(EXTREME),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
)
HONEST = st.floats(-1e6, 1e6, width=32, allow_subnormal=False)

settings.register_profile("rules", max_examples=60, deadline=None)
settings.load_profile("rules")


@st.composite
def corrupted(draw, max_bad, values=ARBITRARY):
    """(n, q, honest matrix, corrupted matrix, bad mask); ``max_bad(n, q)`` bad per column."""
    n = draw(st.sampled_from(NS))
    q = draw(st.integers(0, (n + 1) // 2 - 1))
    d = draw(st.integers(1, 9))
    honest = np.array(
        draw(st.lists(HONEST, min_size=n * d, max_size=n * d)), dtype=np.float32
    ).reshape(n, d)
    G = honest.copy()
    bad = np.zeros((n, d), dtype=bool)
    for j in range(d):
        b = draw(st.integers(0, max_bad(n, q)))
        rows = draw(st.permutations(range(n)))[:b]
        for i in rows:
            G[i, j] = draw(values)
            bad[i, j] = True
    return n, q, honest, G, bad


def honest_range(honest: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = np.where(bad, np.inf, honest).min(axis=0)
    hi = np.where(bad, -np.inf, honest).max(axis=0)
    return lo, hi


def within(out: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    slack = 1e-6 * np.maximum(np.abs(lo), np.abs(hi)) + 1e-30
    return bool(np.all(out >= lo - slack) and np.all(out <= hi + slack))


def aggregate(name: str, G: np.ndarray, q: int) -> np.ndarray:
    return make_rule(name, G.shape[0], q)(torch.from_numpy(G)).numpy()


@given(corrupted(lambda n, q: (n - 1) // 2))
def test_marmed_stays_in_honest_range_below_half_bad(case) -> None:
    _, _, honest, G, bad = case
    lo, hi = honest_range(honest, bad)
    assert within(aggregate("marmed", G, 0), lo, hi)


@given(corrupted(lambda n, q: q))
def test_trimmed_mean_stays_in_honest_range_with_q_bad(case) -> None:
    _, q, honest, G, bad = case
    lo, hi = honest_range(honest, bad)
    assert within(aggregate("trimmed-mean", G, q), lo, hi)


@given(corrupted(lambda n, q: q, values=st.sampled_from(EXTREME)))
def test_meamed_drops_q_extreme_values(case) -> None:
    _, q, honest, G, bad = case
    lo, hi = honest_range(honest, bad)
    assert within(aggregate("meamed", G, q), lo, hi)


@given(corrupted(lambda n, q: q))
def test_meamed_deviation_is_bounded_with_q_arbitrary_values(case) -> None:
    # the median lies in [lo, hi]; the n - q kept values are no farther from it than the
    # (n - q)-th nearest honest value, so within hi - lo of it
    _, q, honest, G, bad = case
    lo, hi = honest_range(honest, bad)
    out = aggregate("meamed", G, q)
    assert within(out, lo - (hi - lo), hi + (hi - lo))


@st.composite
def nan_rows(draw, ns):
    """A matrix where a random proper subset of rows holds NaN/Inf somewhere."""
    n = draw(st.sampled_from(ns))
    d = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((n, d)).astype(np.float32)
    poisoned = draw(st.sets(st.integers(0, n - 1), max_size=n - 1))
    for i in poisoned:
        for j in draw(st.sets(st.integers(0, d - 1), min_size=1)):
            G[i, j] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    return G, sorted(poisoned)


@given(nan_rows([1, 2, 3, 5, 8]), st.sampled_from(["medoid", "geomed"]))
def test_medoid_and_geomed_never_return_nan_while_a_row_is_finite(case, name) -> None:
    G, poisoned = case
    rule = make_rule(name, G.shape[0], 0)
    out = rule(torch.from_numpy(G)).numpy()
    assert np.isfinite(out).all()
    assert not set(poisoned) & set(rule.last_info.get("selected", []))


@given(nan_rows([5, 6, 7, 10]), st.sampled_from(["krum", "multikrum"]), st.data())
def test_krum_never_returns_nan_while_a_row_is_finite(case, name, data) -> None:
    G, poisoned = case
    n = G.shape[0]
    q = data.draw(st.integers(0, (n - 3) // 2))
    rule = make_rule(name, n, q)
    out = rule(torch.from_numpy(G)).numpy()
    assert np.isfinite(out).all()
    assert not set(poisoned) & set(rule.last_info["selected"])


@given(
    st.sampled_from([(5, 1), (7, 2), (10, 3), (10, 1)]),
    st.integers(0, 2**32 - 1),
    st.sampled_from([1e6, -1e6, 1e20, 3e38, math.nan, math.inf]),
    st.booleans(),
)
def test_krum_picks_an_honest_row_against_q_far_byzantine_rows(
    nq, seed, far: float, identical: bool
) -> None:
    n, q = nq
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 9))
    G = rng.uniform(-1, 1, size=(n, d)).astype(np.float32)
    byzantine = rng.choice(n, size=q, replace=False)
    scale = np.ones((q, d)) if identical else rng.uniform(1, 2, size=(q, d))
    with np.errstate(over="ignore"):  # 3e38 * 2 becomes inf: one more far value
        G[byzantine] = (far * scale).astype(np.float32)
    for name in ("krum", "multikrum"):
        rule = make_rule(name, n, q, **({"m": n - q} if name == "multikrum" else {}))
        rule(torch.from_numpy(G))
        assert not set(byzantine.tolist()) & set(rule.last_info["selected"]), name
