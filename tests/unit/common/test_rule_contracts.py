"""Contracts shared by every rule and pre-aggregator (``common.learn.rules.base``,
``common.learn.rules.pre.base``): the input they accept, what an all-NaN input gives, and
SMEA's tie-break under eigenvalue rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.learn.rules import RuleError, make_rule, rule_names
from common.learn.rules.pre import Chain, RoundContext, pre_names

CTX = RoundContext(seed=3, round=2, shard=0)
SIZES = [(11, 2), (10, 1)]  # odd and even n: MarMed's NaN reading depends on parity


def matrix(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32))


@pytest.mark.parametrize(("n", "q"), SIZES)
@pytest.mark.parametrize("name", rule_names())
def test_an_all_nan_input_aggregates_to_nan(name: str, n: int, q: int) -> None:
    out = make_rule(name, n, q)(torch.full((n, 4), float("nan"))).numpy()
    if name == "centered-clipping":  # no finite row moves it from its start, 0
        np.testing.assert_array_equal(out, np.zeros(4, dtype=np.float32))
    else:
        assert np.isnan(out).all(), out


@pytest.mark.parametrize(("n", "q"), SIZES)
@pytest.mark.parametrize("name", sorted(set(rule_names()) - {"centered-clipping"}))
def test_an_all_nan_coordinate_comes_out_nan_and_the_others_finite(name: str, n: int,
                                                                   q: int) -> None:
    G = matrix(n, 4, seed=n)
    G[:, 2] = float("nan")
    out = make_rule(name, n, q)(G).numpy()
    assert np.isnan(out[2]) and np.isfinite(np.delete(out, 2)).all(), out


def test_marking_a_nan_coordinate_never_writes_the_input() -> None:
    G = torch.full((11, 3), float("nan"))
    before = G.clone()
    out = make_rule("marmed", 11, 2)(G)
    assert torch.isnan(out).all()
    torch.testing.assert_close(G, before, equal_nan=True)  # the input is never written


@pytest.mark.parametrize("name", pre_names())
def test_a_pre_aggregator_keeps_all_nan_rows_and_columns_nan(name: str) -> None:
    chain = Chain((name,), 11, 2, {})
    out = chain(torch.full((11, 4), float("nan")), CTX)
    assert out.shape == (chain.rows_out, 4) and out.dtype == torch.float32
    assert torch.isnan(out).all()
    G = matrix(11, 4, seed=1)
    G[:, 1] = float("nan")
    out = chain(G, CTX)
    assert torch.isnan(out[:, 1]).all()


@pytest.mark.parametrize("name", pre_names())
def test_a_pre_aggregator_checks_its_input_as_a_rule_does(name: str) -> None:
    chain = Chain((name,), 7, 2, {})
    bad = [
        (torch.zeros(7, 4, dtype=torch.float64), "dtype float32"),
        (torch.zeros(7, 4, dtype=torch.float16), "dtype float32"),
        (torch.zeros(7), "2-D"),
        (torch.zeros(6, 4), "n=7 rows, got 6"),
        (torch.zeros(7, 0), "d=0"),
        (np.zeros((7, 4), dtype=np.float32), "torch.Tensor"),
    ]
    for G, message in bad:
        with pytest.raises(RuleError, match=f"{name} .*{message}"):
            chain(G, CTX)
    out = chain(matrix(40, 7, seed=2).T, CTX)  # a non-contiguous float32 view is fine
    assert out.dtype == torch.float32 and out.is_contiguous()


def test_smea_ties_go_to_the_first_subset_despite_eigenvalue_rounding() -> None:
    # {0, 1, 2} and {0, 1, 3} both have scatter 14/3; rounding once chose {0, 1, 3}: -2/3
    rule = make_rule("smea", 4, 1)
    out = rule(torch.tensor([[-1.0], [1.0], [2.0], [-2.0]]))
    assert rule.last_info["selected"] == [0, 1, 2]
    assert out.item() == pytest.approx(2 / 3)


def test_smea_still_prefers_a_subset_that_is_smaller_beyond_the_tolerance() -> None:
    rule = make_rule("smea", 4, 1)
    rule(torch.tensor([[-1.0], [1.0], [2.0], [-1.9]]))  # {0, 1, 3}: 13.47/3 < 14/3
    assert rule.last_info["selected"] == [0, 1, 3]
