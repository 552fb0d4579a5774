"""Pre-aggregators (NNM, bucketing, ARC) against brute-force references, the chain, the
checks of --pre with the rule at configuration time, and the README's table."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import ConfigError
from common.learn.rules import RuleError
from common.learn.rules.defence import rule_options
from common.learn.rules.pre import (
    PRE_AGGREGATORS,
    Chain,
    RoundContext,
    check_chain,
    parse_chain,
    pre_class,
    pre_names,
)
from common.learn.seeding import derive_rng
from common.run.config import RunConfig
from server.options import ServerOptions

CTX = RoundContext(seed=5, round=7, shard=1)


def matrix(n: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def apply(names: tuple[str, ...], X: np.ndarray, q: int, context: RoundContext = CTX,
          **options) -> tuple[np.ndarray, list[dict]]:
    chain = Chain(names, X.shape[0], q, options)
    G = torch.from_numpy(X)
    before = G.clone()
    out = chain(G, context)
    assert torch.equal(G.view(torch.int32), before.view(torch.int32)), "G was modified"
    assert out.dtype == torch.float32 and out.shape == (chain.rows_out, X.shape[1])
    return out.numpy(), chain.last_info


# ------------------------------------------------------------------ references


def ref_nnm(X: np.ndarray, q: int) -> np.ndarray:
    """Explicit sort of each row's distances (float64; ties by index)."""
    Y = X.astype(np.float64)
    out = []
    for i in range(len(Y)):
        dist = np.sqrt(((Y - Y[i]) ** 2).sum(1))
        nearest = sorted(range(len(Y)), key=lambda j, dist=dist: (dist[j], j))[: len(Y) - q]
        out.append(Y[nearest].mean(0))
    return np.array(out)


def ref_bucketing(X: np.ndarray, s: int, context: RoundContext) -> np.ndarray:
    pi = derive_rng(context.seed, "bucketing", context.round, context.shard).permutation(len(X))
    Y = X.astype(np.float64)
    return np.array([Y[pi[b:b + s]].mean(0) for b in range(0, len(X), s)])


def ref_arc(X: np.ndarray, q: int) -> np.ndarray:
    n = len(X)
    k = math.floor(Fraction(2 * q, n) * (n - q))
    Y = X.astype(np.float64)
    norms = np.sqrt((Y**2).sum(1))
    order = sorted(range(n), key=lambda i: (norms[i], i))
    out = Y.copy()
    if k:
        threshold = norms[order[n - k - 1]]
        for i in order[n - k:]:
            out[i] = Y[i] * min(1.0, threshold / norms[i])
    return out


# ------------------------------------------------------------------ matches

CASES = [(n, q) for n in (1, 2, 3, 4, 7, 10) for q in range(0, (n + 1) // 2)]


@pytest.mark.parametrize(("n", "q"), CASES)
def test_nnm_matches_explicit_sorting(n: int, q: int) -> None:
    X = matrix(n, 9, seed=n + 31 * q)
    out, _ = apply(("nnm",), X, q)
    np.testing.assert_allclose(out, ref_nnm(X, q), rtol=1e-6, atol=1e-6)


def test_nnm_ties_go_to_the_lower_index() -> None:
    X = np.array([[0.0], [1.0], [-1.0]], dtype=np.float32)  # rows 1, 2 tie for row 0
    out, _ = apply(("nnm",), X, 1)
    assert out[0, 0] == np.float32(0.5)  # its n-q = 2 nearest: itself and row 1
    np.testing.assert_allclose(out[:, 0], ref_nnm(X, 1)[:, 0], rtol=1e-6)


@pytest.mark.parametrize(("n", "s"), [(1, 1), (5, 1), (5, 2), (6, 2), (7, 3), (10, 4),
                                      (10, 10), (20, 2)])
def test_bucketing_matches_its_permutation(n: int, s: int) -> None:
    X = matrix(n, 5, seed=n * s)
    out, info = apply(("bucketing",), X, 0, bucketing={"s": s})
    assert out.shape[0] == -(-n // s)
    np.testing.assert_allclose(out, ref_bucketing(X, s, CTX), rtol=1e-6, atol=1e-7)
    assert sorted(info[0]["permutation"]) == list(range(n))


def test_bucketing_shuffles_per_seed_round_and_shard() -> None:
    X = matrix(8, 3, seed=0)
    base, _ = apply(("bucketing",), X, 0, bucketing={"s": 2})
    again, _ = apply(("bucketing",), X, 0, bucketing={"s": 2})
    np.testing.assert_array_equal(base, again)  # deterministic
    for other in (RoundContext(6, 7, 1), RoundContext(5, 8, 1), RoundContext(5, 7, 0)):
        moved, _ = apply(("bucketing",), X, 0, context=other, bucketing={"s": 2})
        assert not np.array_equal(base, moved), other


@pytest.mark.parametrize(("n", "q"), CASES)
def test_arc_matches_explicit_sorting(n: int, q: int) -> None:
    X = matrix(n, 6, seed=7 * n + q) * np.arange(1, n + 1, dtype=np.float32)[:, None]
    out, info = apply(("arc",), X, q)
    np.testing.assert_allclose(out, ref_arc(X, q), rtol=1e-6, atol=1e-6)
    assert len(info[0].get("clipped", [])) <= 2 * q * (n - q) // n


def test_arc_leaves_the_input_alone_when_nothing_is_clipped() -> None:
    chain = Chain(("arc",), 5, 0, {})
    G = torch.from_numpy(matrix(5, 3, seed=1))
    assert chain(G, CTX) is G  # k = 0: no copy


def test_chain_applies_in_order() -> None:
    X = matrix(10, 4, seed=3) * 10
    out, info = apply(("arc", "nnm"), X, 2)
    np.testing.assert_allclose(out, ref_nnm(ref_arc(X, 2).astype(np.float32), 2), rtol=1e-5,
                               atol=1e-5)
    assert [step["pre"] for step in info] == ["arc", "nnm"]
    out, _ = apply(("bucketing", "nnm"), X, 1, bucketing={"s": 2})
    np.testing.assert_allclose(out, ref_nnm(ref_bucketing(X, 2, CTX).astype(np.float32), 1),
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ non-finite rows


def test_nnm_passes_nonfinite_rows_and_mixes_only_finite_ones() -> None:
    X = matrix(7, 4, seed=8)
    X[2, 1] = np.nan
    X[5, 3] = -np.inf
    out, info = apply(("nnm",), X, 2)
    assert info[0]["passed"] == [2, 5]
    assert np.isnan(out[2, 1]) and out[5, 3] == -np.inf
    np.testing.assert_array_equal(np.delete(out[2], 1), np.delete(X[2], 1))
    finite = [0, 1, 3, 4, 6]
    np.testing.assert_allclose(out[finite], ref_nnm(X[finite], 0), rtol=1e-6, atol=1e-6)


def test_arc_zeroes_clipped_nonfinite_rows() -> None:
    X = matrix(10, 3, seed=9)
    X[4, 0] = np.nan  # k = 2*3*7 // 10 = 4 rows are clipped: the NaN row first
    out, info = apply(("arc",), X, 3)
    assert np.isfinite(out).all() and not out[4].any()
    assert 4 in info[0]["clipped"]


def test_arc_with_more_nonfinite_rows_than_it_clips_passes_them() -> None:
    X = matrix(5, 3, seed=10)
    X[[0, 1, 2], 0] = np.inf  # k = 2*1*4 // 5 = 1 < 3: the threshold is infinite
    out, _ = apply(("arc",), X, 1)
    np.testing.assert_array_equal(out, X)


def test_bucketing_propagates_nonfinite_values_to_their_bucket_only() -> None:
    X = matrix(6, 2, seed=11)
    X[3, 0] = np.nan
    out, info = apply(("bucketing",), X, 0, bucketing={"s": 2})
    pi = info[0]["permutation"]
    bucket = pi.index(3) // 2
    assert np.isnan(out[bucket, 0]) and np.isfinite(np.delete(out, bucket, axis=0)).all()


def test_huge_rows_clip_and_mix_without_overflow() -> None:
    X = matrix(7, 4, seed=12)
    X[0] = 3.4e38
    out, _ = apply(("arc",), X, 2)
    assert np.isfinite(out).all() and np.abs(out).max() < 1e3
    out, _ = apply(("nnm",), X, 2)
    assert np.isfinite(out).all()


# ------------------------------------------------------------------ checks


def test_registry_and_parsing() -> None:
    assert pre_names() == ["arc", "bucketing", "nnm"] == sorted(PRE_AGGREGATORS)
    assert parse_chain(" arc , nnm ") == ("arc", "nnm")
    assert parse_chain("") == parse_chain("none") == ()
    with pytest.raises(RuleError, match="unknown pre-aggregator 'krum'; valid: arc, bucketing"):
        parse_chain("nnm,krum")


@pytest.mark.parametrize(
    ("name", "n", "q", "options", "message"),
    [
        ("nnm", 6, 3, {}, "nnm needs 2q < n, got n=6, q=3"),
        ("arc", 4, 2, {}, "arc needs 2q < n, got n=4, q=2"),
        ("bucketing", 5, 1, {"s": 0}, "bucketing needs 1 <= s <= n, got s=0, n=5"),
        ("bucketing", 5, 1, {"s": 6}, "bucketing needs 1 <= s <= n, got s=6, n=5"),
        ("bucketing", 5, 1, {"s": 2.5}, "must be an integer"),
        ("nnm", 5, 5, {}, "needs 0 <= q < n, got n=5, q=5"),
        ("nnm", 5, 1, {"s": 2}, "unknown option"),
    ],
)
def test_preconditions(name: str, n: int, q: int, options: dict, message: str) -> None:
    with pytest.raises(RuleError, match=message):
        pre_class(name)(n, q, **options)


def test_the_rule_is_checked_with_the_bucketed_rows_and_the_same_q() -> None:
    assert check_chain(("bucketing",), "trimmed-mean", 20, 4, {"bucketing": {"s": 2}}, {}) == 10
    with pytest.raises(RuleError, match=re.escape(
            "trimmed-mean gets 10 rows after --pre bucketing (n=20), with q=5: trimmed-mean "
            "needs q <= ceil(n/2)-1, got n=10, q=5")):
        check_chain(("bucketing",), "trimmed-mean", 20, 5, {"bucketing": {"s": 2}}, {})
    with pytest.raises(RuleError, match="nnm needs 2q < n, got n=4, q=2"):
        check_chain(("bucketing", "nnm"), "mean", 7, 2, {"bucketing": {"s": 2}}, {})


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"pre": "nnm,median"}, "--pre 'nnm,median': unknown pre-aggregator 'median'"),
        ({"pre": "nnm", "q": 10}, "nnm needs 2q < n, got n=20, q=10"),
        ({"pre": "bucketing", "rule": "krum", "q": 8}, "krum gets 10 rows after --pre "
         "bucketing (n=20), with q=8: krum needs 2q+2 < n, got n=10, q=8"),
        ({"pre": "bucketing", "bucket_size": 21}, "bucketing needs 1 <= s <= n, got s=21, n=20"),
        ({"bucket_size": 0}, "--bucket-size must be >= 1"),
        ({"rule": "centered-clipping", "cc_iters": 0}, "--cc-iters must be >= 1"),
        ({"rule": "centered-clipping", "cc_tau": 0.0}, "tau must be a positive number"),
        ({"rule": "mda", "num_workers": 30, "q": 12}, "C(30, 12) = 86493225"),
    ],
)
def test_run_configuration_errors_name_both_numbers(changes: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        RunConfig(**changes).validate()


def test_run_configuration_normalises_the_chain_and_defaults_q_for_bucketed_rows() -> None:
    cfg = RunConfig(pre=" arc, nnm ", rule="trimmed-mean").validate()
    assert cfg.pre == "arc,nnm" and cfg.q == 8
    assert RunConfig(pre="", rule="mean").validate().pre is None
    assert cfg.config_hash == RunConfig(pre="arc,nnm", rule="trimmed-mean").validate().config_hash
    assert cfg.config_hash != RunConfig(pre="nnm,arc", rule="trimmed-mean").validate().config_hash
    bucketed = RunConfig(pre="bucketing", rule="krum").validate()
    assert bucketed.q == 3  # Krum's default for ceil(20/2) = 10 rows
    assert RunConfig(pre="bucketing", rule="krum", bucket_size=4).validate().q == 1
    assert rule_options(RunConfig(rule="centered-clipping", cc_tau=2.5, cc_iters=3)
                        .validate()) == {"tau": 2.5, "iters": 3}


def test_quorum_is_checked_through_the_chain() -> None:
    cfg = RunConfig(num_workers=10, pre="bucketing", rule="trimmed-mean", q=2).validate()
    ServerOptions(round_timeout="1.0", quorum=9).check(cfg)  # 5 buckets, q=2: fine
    with pytest.raises(ConfigError, match=re.escape("trimmed-mean gets 4 rows after --pre "
                                                    "bucketing (n=8), with q=2")):
        ServerOptions(round_timeout="1.0", quorum=8).check(cfg)


def test_readme_lists_every_pre_aggregator() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    for name, cls in PRE_AGGREGATORS.items():
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{name}` |")),
                   None)
        assert row is not None and cls.summary in row and cls.needs in row, name
