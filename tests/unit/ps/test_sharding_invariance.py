"""Why the S = 1 check of the paper grid (docs/results/paper-s1/) covers the vector rules
only: a coordinate-wise rule's output at a coordinate depends on that coordinate's n
values alone, so spreading the model over S servers cannot change a run of it, under
any of the scenarios that can run at S = 1 (the gambler is defined over 20 servers):
the median-based rules end bit-identical, Mean to float32 rounding (torch's mean sums in
an order that depends on the row's width). A rule that selects whole vectors selects per
shard at S > 1, and can end elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from common.run.config import AttackConfig, RunConfig
from ps.reference.engine import simulate

SCENARIOS = {
    "none": {},
    "gaussian": {"worker_attack": "gaussian", "byzantine_workers": (0, 1)},
    "omniscient": {"worker_attack": "omniscient", "byzantine_workers": (0, 1)},
    "bitflip": {"proxy_attack": "bitflip"},
}


def _params(rule: str, shards: int, scenario: str) -> np.ndarray:
    cfg = RunConfig(dataset="synthetic", num_workers=7, num_shards=shards, rounds=3,
                    rule=rule, q=2).validate()
    attack = AttackConfig.build(**SCENARIOS[scenario]).validate(cfg)
    return simulate(cfg, attack).params


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("rule", ["marmed", "meamed", "trimmed-mean"])
def test_a_median_based_rule_ends_bit_identical_on_one_server_and_on_four(
        rule: str, scenario: str) -> None:
    np.testing.assert_array_equal(_params(rule, 1, scenario), _params(rule, 4, scenario))


@pytest.mark.parametrize("scenario", ["none", "gaussian"])
def test_mean_ends_equal_to_rounding_on_one_server_and_on_four(scenario: str) -> None:
    np.testing.assert_allclose(_params("mean", 1, scenario), _params("mean", 4, scenario),
                               rtol=1e-4, atol=1e-6)


def test_a_rule_that_selects_vectors_ends_elsewhere_when_it_selects_per_shard() -> None:
    one, four = _params("krum", 1, "omniscient"), _params("krum", 4, "omniscient")
    assert np.abs(one - four).max() > 1e-3
