"""The heterogeneity claims on constructed results: each check holds, differs, is
inconclusive or not run as the numbers say, split by split."""

from __future__ import annotations

import pytest

from ps.experiments.claims import DIFFERS, HOLDS, INCONCLUSIVE, NOT_RUN
from ps.experiments.heteroclaims import (
    NOT_APPLICABLE,
    Finals,
    _close_to_iid,
    _mimic_costs,
    _momentum_helps,
    _recovers,
    _robust_alone_lose,
    hetero_claim_lines,
)

TIGHT = (-0.002, 0.0, 0.002)  # three seeds around a mean: a small spread
WIDE = (-0.2, 0.0, 0.2)  # a spread that decides nothing


def _runs(defence: str, split: str, attack: str, mean: float, spread=TIGHT,
          momentum: float = 0.9) -> list[dict]:
    partition, _, alpha = split.partition(" α=")
    axes = {"partition": partition, **({"alpha": float(alpha)} if alpha else {})}
    return [{"axes": axes, "defence": defence, "scenario": attack, "seed": seed,
             "worker_momentum": momentum, "points": [{"top1": mean + d}]}
            for seed, d in enumerate(spread)]


def _finals(*groups: list[dict]) -> Finals:
    return Finals([r for g in groups for r in g], "top1")


def test_robust_rules_alone_lose_accuracy_without_attack() -> None:
    split = "dirichlet α=0.1"
    mean = _runs("mean", split, "none", 0.80)
    lower = [_runs(r, split, "none", 0.70) for r in ("trimmed-mean", "krum")]
    assert _robust_alone_lose(_finals(mean, *lower), split).outcome == HOLDS
    as_good = _runs("geomed", split, "none", 0.85)
    assert _robust_alone_lose(_finals(mean, *lower, as_good), split).outcome == DIFFERS
    unsure = _runs("geomed", split, "none", 0.79, WIDE)
    assert _robust_alone_lose(_finals(mean, *lower, unsure), split).outcome == INCONCLUSIVE
    assert _robust_alone_lose(_finals(*lower), split).outcome == NOT_RUN


def test_a_pre_aggregation_recovers_a_rule_by_its_worst_case() -> None:
    check, split = _recovers("nnm", ("krum",)), "extreme"
    krum = _runs("krum", split, "alie", 0.3) + _runs("krum", split, "ipm", 0.7)
    # NNM's worst case (ipm 0.6) above Krum's (alie 0.3): holds
    assert check(_finals(krum, _runs("nnm+krum", split, "alie", 0.8),
                         _runs("nnm+krum", split, "ipm", 0.6)), split).outcome == HOLDS
    assert check(_finals(krum, _runs("nnm+krum", split, "alie", 0.2)), split).outcome == DIFFERS
    assert check(_finals(krum, _runs("nnm+krum", split, "alie", 0.35, WIDE)),
                 split).outcome == INCONCLUSIVE
    verdict = check(_finals(krum), split)
    assert verdict.outcome == NOT_RUN
    assert "0.300" in check(_finals(krum, _runs("nnm+krum", split, "alie", 0.8)),
                            split).evidence


def test_mimic_costs_a_robust_rule_more_than_the_near_margin() -> None:
    split = "iid"
    none = _runs("krum", split, "none", 0.80)
    assert _mimic_costs(_finals(none, _runs("krum", split, "mimic", 0.60)),
                        split).outcome == HOLDS
    assert _mimic_costs(_finals(none, _runs("krum", split, "mimic", 0.79)),
                        split).outcome == DIFFERS
    assert _mimic_costs(_finals(none, _runs("krum", split, "mimic", 0.75, WIDE)),
                        split).outcome == INCONCLUSIVE
    assert _mimic_costs(_finals(none), split).outcome == NOT_RUN
    # Karimireddy et al.'s adaptive mimic is the one read where it ran
    both = _finals(none, _runs("krum", split, "mimic", 0.60),
                   _runs("krum", split, "mimic-adaptive", 0.79))
    verdict = _mimic_costs(both, split)
    assert verdict.outcome == DIFFERS and verdict.evidence.startswith("mimic-adaptive: ")


def test_momentum_helps_over_the_attacks_run_at_both_momenta() -> None:
    split = "iid"
    slow = _runs("krum", split, "alie", 0.4, momentum=0.0)
    fast = (_runs("krum", split, "alie", 0.7) + _runs("krum", split, "minmax", 0.1))
    # minmax ran only with momentum: not in the comparison
    assert _momentum_helps(_finals(slow, fast), split).outcome == HOLDS
    assert _momentum_helps(_finals(_runs("krum", split, "alie", 0.8, momentum=0.0), fast),
                           split).outcome == DIFFERS
    assert _momentum_helps(_finals(_runs("krum", split, "alie", 0.6, WIDE, momentum=0.0),
                                   fast), split).outcome == INCONCLUSIVE
    assert _momentum_helps(_finals(fast), split).outcome == NOT_RUN


def test_nnm_close_to_its_iid_worst_case() -> None:
    iid = _runs("nnm+krum", "iid", "alie", 0.80)
    split = "extreme"
    assert _close_to_iid(_finals(iid, _runs("nnm+krum", split, "alie", 0.79)),
                         split).outcome == HOLDS
    assert _close_to_iid(_finals(iid, _runs("nnm+krum", split, "alie", 0.5)),
                         split).outcome == DIFFERS
    assert _close_to_iid(_finals(iid, _runs("nnm+krum", split, "alie", 0.74, WIDE)),
                         split).outcome == INCONCLUSIVE
    assert _close_to_iid(_finals(iid), "iid").outcome == NOT_APPLICABLE
    # an attack run on one split only is not in the comparison
    optimised = _runs("nnm+krum", split, "alie-opt", 0.3)
    assert _close_to_iid(_finals(iid, _runs("nnm+krum", split, "alie", 0.79), optimised),
                         split).outcome == HOLDS


def test_the_report_section_has_a_column_per_split_and_is_left_out_without_partitions(
        ) -> None:
    results = (_runs("mean", "iid", "none", 0.8) + _runs("krum", "iid", "none", 0.7)
               + _runs("mean", "extreme", "none", 0.7) + _runs("krum", "extreme", "none", 0.5))
    lines = hetero_claim_lines(results, "top1")
    header = next(line for line in lines if line.startswith("| claim |"))
    assert header.endswith("| iid | extreme |")
    row = next(line for line in lines if line.startswith("| robust rules alone"))
    assert row.endswith("| n/a | holds |")  # a claim about heterogeneous data
    no_partition = [{**r, "axes": {}} for r in results]
    assert hetero_claim_lines(no_partition, "top1") == []
    # a grid of centered clipping alone (the radius fit) has nothing any claim reads
    assert hetero_claim_lines(_runs("centered-clipping", "iid", "alie", 0.7), "top1") == []


def test_runs_that_differ_on_another_axis_are_not_pooled_into_seeds() -> None:
    """Two learning rates of one (defence, split, momentum, attack): the claims are not
    checked rather than read as six seeds of one cell."""
    results = []
    for lr, mean in ((0.1, 0.8), (0.01, 0.5)):
        for r in _runs("mean", "extreme", "none", mean) + _runs("krum", "extreme", "none",
                                                                 mean - 0.1):
            results.append({**r, "axes": {**r["axes"], "lr": lr}})
    lines = hetero_claim_lines(results, "top1")
    assert any(line.startswith("Not checked: 2 ") for line in lines)


def test_the_worst_case_is_the_lowest_final_of_each_seed_then_over_seeds() -> None:
    """Two attacks each worst on another seed: the minimum of their means (0.7) would
    hide that every seed lost to one of them (0.5)."""
    split = "dirichlet α=0.1"
    alie = _runs("krum", split, "alie", 0.7, (-0.2, 0.2, -0.2))
    ipm = _runs("krum", split, "ipm", 0.7, (0.2, -0.2, 0.2))
    attack, sample = _finals(alie, ipm).worst("krum", split, 0.9)
    assert sample.values == pytest.approx({0: 0.5, 1: 0.5, 2: 0.5})
    assert attack == "alie"  # worst on two seeds of three
