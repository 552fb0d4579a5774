"""Property tests (hypothesis) of the new rules and pre-aggregators: what q Byzantine rows
(arbitrary values, NaN and infinities included) can and cannot do.

Classic Byzantine model: at most q whole rows are arbitrary, the others honest.  Each
property is the resilience statement of its rule, with a float slack:

* MDA: the output lies within the honest diameter of some honest row;
* SMEA: ``||out - mean(H)|| <= 2 sqrt(lambda_H q / (n - 2q))`` (lambda_H: top eigenvalue
  of the honest rows' covariance), since the chosen subset's covariance is no larger
  than the honest one's and shares n - 2q rows with it;
* CAF: rows made far away (a coordinate set to an extreme value) get weight 0, so the
  output is a convex combination of honest rows;
* centered clipping: each row moves the output by at most tau/n, so q rows by 2 q tau/n
  against any other choice of theirs;
* NNM: an honest row moves by at most the honest diameter (its n - q nearest rows are no
  farther than the farthest honest row);
* ARC: every output row's norm is at most the largest honest norm;
* bucketing then MarMed: per coordinate within the honest range while fewer than half the
  buckets can hold a Byzantine row.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from common.learn.rules import make_rule
from common.learn.rules.pre import Chain, RoundContext

NS = [1, 2, 3, 4, 5, 6, 7, 9]
EXTREME = [math.nan, math.inf, -math.inf, 1e20, -1e20, 3.4e38, -3.4e38]
ARBITRARY = st.one_of(st.sampled_from(EXTREME),
                      st.floats(width=32, allow_nan=True, allow_infinity=True))
HONEST = st.floats(-100, 100, width=32, allow_subnormal=False)

settings.register_profile("rules-extra", max_examples=50, deadline=None)
settings.load_profile("rules-extra")


@st.composite
def byzantine_rows(draw, max_q=lambda n: (n - 1) // 2, far=False, ns=NS):
    """(n, q, honest row ids, matrix): q rows replaced by arbitrary values; with ``far``
    each of them keeps honest values but for one extreme coordinate."""
    n = draw(st.sampled_from(ns))
    q = draw(st.integers(0, max_q(n)))
    d = draw(st.integers(1, 5))
    X = np.array(draw(st.lists(HONEST, min_size=n * d, max_size=n * d)),
                 dtype=np.float32).reshape(n, d)
    bad = draw(st.permutations(range(n)))[:q]
    for i in bad:
        if far:
            X[i, draw(st.integers(0, d - 1))] = draw(st.sampled_from(EXTREME))
        else:
            X[i] = np.array(draw(st.lists(ARBITRARY, min_size=d, max_size=d)), dtype=np.float32)
    honest = np.array(sorted(set(range(n)) - set(bad)), dtype=np.int64)
    return n, q, honest, X


def diameter(Y: np.ndarray) -> float:
    Y = Y.astype(np.float64)
    return float(np.sqrt(((Y[:, None] - Y[None]) ** 2).sum(-1)).max())


def slack(H: np.ndarray) -> float:
    return 1e-5 * (1.0 + float(np.abs(H).max())) * math.sqrt(H.shape[1])


def aggregate(name: str, X: np.ndarray, q: int, **options) -> np.ndarray:
    return make_rule(name, X.shape[0], q, **options)(torch.from_numpy(X)).numpy()


@given(byzantine_rows())
def test_mda_stays_within_the_honest_diameter_of_an_honest_row(case) -> None:
    _, q, honest, X = case
    out = aggregate("mda", X, q).astype(np.float64)
    H = X[honest].astype(np.float64)
    nearest = np.sqrt(((H - out) ** 2).sum(1)).min()
    assert nearest <= diameter(H) * (1 + 1e-6) + slack(H)


@given(byzantine_rows())
def test_smea_is_within_its_resilience_bound_of_the_honest_mean(case) -> None:
    n, q, honest, X = case
    out = aggregate("smea", X, q).astype(np.float64)
    H = X[honest].astype(np.float64)
    centered = H - H.mean(0)
    lam = float(np.linalg.eigvalsh(centered.T @ centered / len(H))[-1])
    bound = 2 * math.sqrt(max(lam, 0.0) * q / (n - 2 * q))
    assert np.linalg.norm(out - H.mean(0)) <= bound * (1 + 1e-6) + 10 * slack(H)


@given(byzantine_rows(far=True))
def test_caf_gives_far_rows_no_weight(case) -> None:
    n, q, honest, X = case
    rule = make_rule("caf", n, q)
    out = rule(torch.from_numpy(X)).numpy()
    weights = np.array(rule.last_info["weights"])
    far = np.setdiff1d(np.arange(n), honest)
    far = far[~np.isfinite(X[far]).all(1) | (np.abs(X[far]).max(1) >= 1e20)]
    assert not weights[far].any()
    H = X[honest]
    assert np.all(out >= H.min(0) - slack(H)) and np.all(out <= H.max(0) + slack(H))


@given(byzantine_rows(max_q=lambda n: n - 1), st.floats(0.1, 10.0), st.integers(0, 2**31))
def test_centered_clipping_moves_at_most_tau_over_n_per_byzantine_row(case, tau, seed) -> None:
    n, q, honest, X = case
    center = np.random.default_rng(seed).standard_normal(X.shape[1]).astype(np.float32)
    other = X.copy()
    other[np.setdiff1d(np.arange(n), honest)] = X[honest[0]]  # any other Byzantine choice

    def cc(M: np.ndarray) -> np.ndarray:
        rule = make_rule("centered-clipping", n, 0, tau=tau)
        rule.set_state({"center": center})
        return rule(torch.from_numpy(M)).numpy().astype(np.float64)

    out = cc(X)
    assert np.isfinite(out).all()
    gap = np.linalg.norm(out - cc(other))
    assert gap <= 2 * q * tau / n * (1 + 1e-5) + 1e-5 * (1 + np.abs(out).max())


@given(byzantine_rows())
def test_nnm_moves_an_honest_row_at_most_the_honest_diameter(case) -> None:
    n, q, honest, X = case
    out = Chain(("nnm",), n, q, {})(torch.from_numpy(X), RoundContext()).numpy()
    H = X[honest].astype(np.float64)
    moved = np.sqrt(((out[honest].astype(np.float64) - H) ** 2).sum(1)).max()
    assert moved <= diameter(H) * (1 + 1e-6) + slack(H)


@given(byzantine_rows())
def test_arc_leaves_no_row_longer_than_the_longest_honest_one(case) -> None:
    n, q, honest, X = case
    out = Chain(("arc",), n, q, {})(torch.from_numpy(X), RoundContext()).numpy()
    H = X[honest].astype(np.float64)
    longest = np.sqrt((H**2).sum(1)).max()
    assert np.isfinite(out).all()
    assert np.sqrt((out.astype(np.float64) ** 2).sum(1)).max() <= longest * (1 + 1e-6) + 1e-30


@st.composite
def bucketed(draw):
    n = draw(st.sampled_from(NS))
    s = draw(st.integers(1, min(3, n)))
    buckets = -(-n // s)
    case = draw(byzantine_rows(max_q=lambda m: (buckets + 1) // 2 - 1, ns=[n]))
    return s, case, draw(st.integers(0, 1000))


@given(bucketed())
def test_bucketing_then_marmed_stays_in_the_honest_range(drawn) -> None:
    s, (n, q, honest, X), round_ = drawn
    chain = Chain(("bucketing",), n, q, {"bucketing": {"s": s}})
    rows = chain(torch.from_numpy(X), RoundContext(seed=1, round=round_, shard=0))
    out = make_rule("marmed", chain.rows_out, q)(rows.contiguous()).numpy()
    H = X[honest]
    assert np.all(out >= H.min(0) - slack(H)) and np.all(out <= H.max(0) + slack(H))
