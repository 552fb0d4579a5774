"""The verdicts on the paper's claims (``ps/experiments/claims.py``): comparisons paired
by seed with 95 % Student-t intervals, and each claim holding, differing and
inconclusive on constructed results."""

from __future__ import annotations

import math
import random
import zlib

import pytest

from ps.experiments.claims import (
    CLAIMS,
    DIFFERS,
    HOLDS,
    INCONCLUSIVE,
    NOT_RUN,
    PAPER,
    Measures,
    Sample,
    below,
    every,
    fixed,
    judge,
    t975,
    ties,
    ties_text,
    within,
)
from ps.experiments.filereport import report_others
from ps.experiments.gridfile import GridFile, ReportAxes
from ps.experiments.modern import modern_tables
from ps.experiments.worstcase import worst_cases

TIGHT = 0.002  # the seeds' offsets from the cell's mean: about -TIGHT, 0, +TIGHT, each
# cell's own (a difference paired by seed has a spread too)

# (rule, scenario) -> (final, speed): a grid where every claim of the paper holds
HOLDING: dict[tuple[str, str], tuple[float, float]] = {
    **{(r, "none"): v for r, v in {
        "mean": (0.90, 0.80), "medoid": (0.88, 0.60), "krum": (0.88, 0.62),
        "multikrum": (0.90, 0.79), "geomed": (0.90, 0.79), "marmed": (0.89, 0.75),
        "meamed": (0.90, 0.79)}.items()},
    **{(r, "gaussian"): (v, v - 0.1) for r, v in {
        "mean": 0.05, "medoid": 0.83, "krum": 0.84, "multikrum": 0.89, "geomed": 0.90,
        "marmed": 0.88, "meamed": 0.90}.items()},
    **{(r, "omniscient"): v for r, v in {
        "mean": (0.0, 0.0), "medoid": (0.05, 0.05), "krum": (0.85, 0.5),
        "multikrum": (0.88, 0.78), "geomed": (0.6, 0.5), "marmed": (0.5, 0.4),
        "meamed": (0.90, 0.79)}.items()},
    **{(r, "bitflip"): (v, v) for r, v in {
        "mean": 0.1, "medoid": 0.1, "krum": 0.1, "multikrum": 0.1, "geomed": 0.1,
        "marmed": 0.88, "meamed": 0.89}.items()},
    **{(r, "gambler"): (v, 0.7) for r, v in {
        "mean": 0.1, "medoid": 0.1, "krum": 0.1, "multikrum": 0.1, "geomed": 0.1,
        "marmed": 0.875, "meamed": 0.865}.items()},
    **{(r, f"q={q}"): (0.1, 0.1) for r in ("krum", "multikrum") for q in (2, 4)},
    ("meamed", "gambler q=2"): (0.1, 0.1),
    # the batch sweep: each rule's gap to Mean 0.04 at batch 8, 0.01 at 128
    **{(r, f"batch={b}"): (final, final) for r in PAPER for b, final in (
        (8, 0.86 if r == "mean" else 0.82), (128, 0.90 if r == "mean" else 0.89))},
}


def results(cells: dict[tuple[str, str], tuple[float, ...]],
            offsets: tuple[float, ...] = (-TIGHT, 0.0, TIGHT)) -> list[dict]:
    """One record per seed: two evaluations whose mean is the speed, the last the
    final; ``(rule, "q=Q")`` is a q-sweep cell under bit-flip, ``(rule, "gambler q=Q")``
    one under the gambler, ``(rule, "batch=B")`` a batch-sweep cell. A third number
    spreads that cell's seeds so many times wider."""
    out = []
    for (rule, scenario), (final, speed, *wider) in cells.items():
        spread = wider[0] if wider else 1
        rng = random.Random(zlib.crc32(f"{rule}/{scenario}".encode()))
        jitter = [rng.uniform(-TIGHT / 2, TIGHT / 2) for _ in offsets]
        jitter = [j - sum(jitter) / len(jitter) for j in jitter]  # the cell's mean kept
        for seed, d in enumerate(spread * (o + j)
                                 for o, j in zip(offsets, jitter, strict=True)):
            points = [{"round": 0, "top1": 2 * speed - final + d},
                      {"round": 1, "top1": final + d}]
            if "q=" in scenario:
                where, _, q = scenario.rpartition("q=")
                out.append({"figure": "q-sweep", "rule": rule,
                            "scenario": where.strip() or "bitflip",
                            "q": int(q), "seed": seed, "points": points})
            elif scenario.startswith("batch="):
                out.append({"figure": "batch-sweep", "rule": rule, "scenario": "none",
                            "q": 8, "batch_size": int(scenario[6:]), "seed": seed,
                            "points": points})
            else:
                out.append({"figure": "paper", "rule": rule, "scenario": scenario,
                            "q": 8, "seed": seed, "points": points})
    return out


def test_below_decides_by_the_interval_of_the_difference_paired_by_seed() -> None:
    assert below(Sample.of([0.5, 0.51, 0.52]), Sample.of([0.7, 0.71, 0.72])) is True
    assert below(Sample.of([0.7, 0.71, 0.72]), Sample.of([0.5, 0.51, 0.52])) is False
    # means 0.51 and 0.53 over seeds that vary widely: when each seed moves both alike
    # the difference is 0.02 every time, decided; when not, inconclusive
    assert below(Sample.of([0.46, 0.51, 0.56]), Sample.of([0.48, 0.53, 0.58])) is True
    assert below(Sample.of([0.46, 0.51, 0.56]), Sample.of([0.58, 0.48, 0.53])) is None
    # a single seed has no spread: inconclusive whatever the difference
    assert below(Sample.of([0.1]), fixed(0.9)) is None
    assert below(fixed(0.1), Sample.of([0.9])) is None


def test_only_the_seeds_both_sides_share_are_paired() -> None:
    a = Sample.of({0: 0.5, 1: 0.52, 2: 0.51, 7: 0.9})
    b = Sample.of({0: 0.6, 1: 0.61, 2: 0.62, 8: 0.1})
    assert (a - b).values == pytest.approx({0: -0.1, 1: -0.09, 2: -0.11})
    assert below(a, b) is True
    assert below(Sample.of({0: 0.5, 1: 0.6}), Sample.of({2: 0.9, 3: 0.95})) is None


def test_the_interval_uses_students_t_over_k_minus_1_degrees_of_freedom() -> None:
    values = [0.80, 0.82, 0.84, 0.86, 0.88]
    sample = Sample.of(values)
    assert sample.half_width == pytest.approx(2.776 * 0.0316228 / math.sqrt(5), rel=1e-4)
    assert sample.text() == "0.840 ± 0.039"
    assert Sample.of([0.8]).text() == "0.800 (1 seed)"
    assert (Sample.of([0.8, 0.9]) - fixed(0.8)).difference_text() == "+0.050 [-0.585, +0.685]"


def test_within_is_an_equivalence_test() -> None:
    a = Sample.of([0.899, 0.9, 0.901])
    assert within(a, Sample.of([0.891, 0.889, 0.89]), 0.02) is True
    assert within(a, Sample.of([0.851, 0.849, 0.85]), 0.02) is False
    assert within(a, Sample.of([0.881, 0.879, 0.88]), 0.02) is None  # gap = tolerance
    assert within(a, Sample.of([0.9]), 0.02) is None


@pytest.mark.parametrize("df,exact", [(1, 12.7062), (4, 2.7764), (9, 2.2622), (30, 2.0423),
                                      (40, 2.0211), (60, 2.0003), (120, 1.9799)])
def test_t975_matches_the_t_distribution(df: int, exact: float) -> None:
    assert t975(df) == pytest.approx(exact, abs=1e-3)


def test_every_is_kleenes_and() -> None:
    assert every([True, True]) is True
    assert every([True, None]) is None
    assert every([None, False]) is False
    assert every([]) is True


def test_every_claim_holds_on_a_grid_built_to_satisfy_it() -> None:
    measures = Measures(results(HOLDING), "top1")
    outcomes = {c.text: judge(c, measures).outcome for c in CLAIMS}
    assert outcomes == {c.text: HOLDS for c in CLAIMS}


def test_a_single_seed_makes_every_claim_inconclusive() -> None:
    measures = Measures(results(HOLDING, offsets=(0.0,)), "top1")
    for claim in CLAIMS:
        v = judge(claim, measures)
        assert v.outcome == INCONCLUSIVE, claim.text
        assert "(1 seed)" in v.evidence


# claim -> (a change that makes it differ, a change that puts it inside the margin)
CHANGES: dict[tuple[str, str], tuple[dict, dict]] = {
    ("none", "all rules converge"): (
        {("medoid", "none"): (0.5, 0.5)}, {("medoid", "none"): (0.81, 0.6)}),
    ("none", "GeoMed, Multi-Krum and MeaMed ~ Mean"): (
        {("geomed", "none"): (0.85, 0.79)}, {("geomed", "none"): (0.88, 0.79)}),
    ("none", "MarMed slightly slower than Mean"): (
        {("marmed", "none"): (0.89, 0.85)}, {("marmed", "none"): (0.89, 0.80)}),
    ("none", "Krum and Medoid slowest"): (
        {("krum", "none"): (0.88, 0.9)}, {("krum", "none"): (0.88, 0.75)}),
    ("gaussian", "Mean fails"): (
        {("mean", "gaussian"): (0.5, 0.4)}, {("mean", "gaussian"): (0.2, 0.1)}),
    ("gaussian", "the other rules converge"): (
        {("krum", "gaussian"): (0.3, 0.2)}, {("krum", "gaussian"): (0.81, 0.7)}),
    ("gaussian", "GeoMed and MeaMed ~ no attack"): (
        {("geomed", "gaussian"): (0.8, 0.7)}, {("geomed", "gaussian"): (0.88, 0.78)}),
    ("gaussian", "Medoid and Krum the worst of the survivors"): (
        {("krum", "gaussian"): (0.95, 0.85)}, {("krum", "gaussian"): (0.88, 0.78)}),
    ("omniscient", "MeaMed ~ no attack"): (
        {("meamed", "omniscient"): (0.8, 0.7)}, {("meamed", "omniscient"): (0.88, 0.78)}),
    ("omniscient", "Multi-Krum close to no attack"): (
        {("multikrum", "omniscient"): (0.7, 0.6)},
        {("multikrum", "omniscient"): (0.85, 0.78)}),
    ("omniscient", "Krum slower (than MeaMed and Multi-Krum), but converges"): (
        {("krum", "omniscient"): (0.85, 0.85)}, {("krum", "omniscient"): (0.85, 0.78)}),
    ("omniscient", "GeoMed and MarMed converge to bad solutions"): (
        {("geomed", "omniscient"): (0.9, 0.8)}, {("geomed", "omniscient"): (0.85, 0.7)}),
    ("omniscient", "Mean and Medoid fail"): (
        {("medoid", "omniscient"): (0.9, 0.8)}, {("medoid", "omniscient"): (0.2, 0.1)}),
    ("bitflip", "only MarMed and MeaMed converge"): (
        {("krum", "bitflip"): (0.9, 0.9)}, {("krum", "bitflip"): (0.81, 0.81)}),
    ("bitflip", "Krum-based rules stuck whatever q"): (
        {("krum", "q=2"): (0.8, 0.8)}, {("krum", "q=2"): (0.2, 0.2)}),
    ("gambler", "only MarMed and MeaMed survive"): (
        {("meamed", "gambler"): (0.1, 0.1)}, {("meamed", "gambler"): (0.81, 0.7)}),
    ("gambler", "MarMed and MeaMed slightly slower than Mean without attack"): (
        {("marmed", "gambler"): (0.86, 0.9)}, {("marmed", "gambler"): (0.85, 0.7)}),
    ("gaussian", "Multi-Krum and MarMed slightly slower (than GeoMed and MeaMed)"): (
        {("marmed", "gaussian"): (0.88, 0.85)}, {("marmed", "gaussian"): (0.88, 0.80)}),
    ("omniscient", "Multi-Krum not as good as MeaMed"): (
        {("multikrum", "omniscient"): (0.92, 0.78)},
        {("multikrum", "omniscient"): (0.90, 0.78)}),
    ("gambler", "MarMed slightly better than MeaMed"): (
        {("marmed", "gambler"): (0.85, 0.7)}, {("marmed", "gambler"): (0.865, 0.7)}),
    ("gambler", "MeaMed fails at q = 2"): (
        {("meamed", "gambler q=2"): (0.8, 0.8)}, {("meamed", "gambler q=2"): (0.2, 0.2)}),
    ("all", "MeaMed performs best in almost all the cases"): (
        {("geomed", "gaussian"): (0.95, 0.8)},  # beaten under Gaussian and the gambler
        # 0.005 below the best under Gaussian, over seeds ten times as spread: not ranked
        {("meamed", "gaussian"): (0.895, 0.79, 10)}),
    ("batch sweep", "the gap to Mean narrows as the batch grows"): (
        {("krum", "batch=128"): (0.80, 0.80)}, {("krum", "batch=128"): (0.86, 0.86)}),
}


def test_every_claim_has_its_changes() -> None:
    assert set(CHANGES) == {(c.scenario, c.text) for c in CLAIMS}


@pytest.mark.parametrize("scenario,text", list(CHANGES), ids=[t for _, t in CHANGES])
def test_each_claim_differs_and_is_inconclusive(scenario: str, text: str) -> None:
    claim = next(c for c in CLAIMS if (c.scenario, c.text) == (scenario, text))
    differ, inside = CHANGES[(scenario, text)]
    assert judge(claim, Measures(results({**HOLDING, **differ}), "top1")).outcome == DIFFERS
    assert judge(claim, Measures(results({**HOLDING, **inside}), "top1")).outcome \
        == INCONCLUSIVE


def test_a_claim_without_its_runs_is_not_run() -> None:
    claim = next(c for c in CLAIMS if c.text == "Mean fails")
    cells = {k: v for k, v in HOLDING.items() if k != ("mean", "gaussian")}
    v = judge(claim, Measures(results(cells), "top1"))
    assert v.outcome == NOT_RUN and v.evidence == "not run: mean/gaussian"  # named once


def test_a_rule_that_does_not_survive_is_not_the_worst_survivor() -> None:
    claim = next(c for c in CLAIMS if c.text == "Medoid and Krum the worst of the survivors")
    v = judge(claim, Measures(results({**HOLDING, ("krum", "gaussian"): (0.3, 0.2)}), "top1"))
    assert v.outcome == DIFFERS


def test_a_scaled_or_shifted_mean_keeps_its_error() -> None:
    a = Sample.of([0.8, 0.9, 1.0])
    assert (a * 0.5).half_width == pytest.approx(a.half_width / 2)
    assert (a + fixed(-0.05)).mean == pytest.approx(0.85)
    assert (a + fixed(-0.05)).half_width == pytest.approx(a.half_width)


def test_a_worst_case_names_what_it_is_not_ranked_apart_from() -> None:
    worst = [0.50, 0.51, 0.52]
    # b is above by 0.01 on average but not on every seed (paired by position)
    assert ties(worst, {"a": [0.8, 0.81, 0.82], "b": [0.53, 0.50, 0.53]}) == ["b"]
    assert ties(worst, {"b": [0.51, 0.52, 0.53]}) == []  # above on every seed alike
    assert ties(worst, {"a": [0.8, 0.81, 0.82]}) == []
    assert ties([0.5], {"a": [0.9]}) is None  # one seed: nothing ranked
    assert ties([float("nan")] * 2, {"a": [0.01, 0.01]}) == []  # diverged: 0, the worst
    assert ties_text(["b", "c"]) == "; ~ b, c" and ties_text([]) == ties_text(None) == ""


def _modern(defence: str, attack: str, finals: list[float]) -> list[dict]:
    return [{"figure": "modern", "worker_momentum": 0.9, "defence": defence, "rule": defence,
             "scenario": attack, "points": [{"top1": v}]} for v in finals]


def test_the_modern_table_shows_the_attacks_tied_with_the_worst() -> None:
    results = (_modern("krum", "alie", [0.50, 0.52]) + _modern("krum", "ipm", [0.53, 0.51])
               + _modern("krum", "inf", [0.90, 0.91]))
    table = "\n".join(modern_tables(results, "top1", ("alie", "ipm", "inf")))
    assert "| 0.510 (alie; ~ ipm) |" in table


def test_a_grid_files_worst_case_keeps_its_ties() -> None:
    axes = ReportAxes("rule", "worker-momentum", "worker-attack")
    results = [{"axes": {"rule": "krum", "worker-momentum": 0.9, "worker-attack": attack},
                "defence": "krum", "points": [{"top1": v}]}
               for attack, values in (("alie", [0.5, 0.52]), ("ipm", [0.53, 0.51]),
                                      ("inf", [0.9, 0.91])) for v in values]
    (table,) = worst_cases(results, "top1", axes, ())
    case = table.cells[("krum", "0.9")]
    assert case is not None
    assert (case.where, case.ties) == ("alie", ["ipm"])


def test_the_heterogeneity_axis_names_each_split_with_its_parameter() -> None:
    """Columns ``iid``, ``dirichlet α=1``, ``dirichlet α=0.1``; alpha is no panel."""
    axes = ReportAxes("defence", "heterogeneity", "worker-attack")
    results = [{"axes": {"rule": "krum", "partition": partition, "alpha": alpha,
                         "worker-attack": attack},
                "defence": "krum", "points": [{"top1": v}]}
               for partition, alpha in (("iid", 1.0), ("dirichlet", 1.0), ("dirichlet", 0.1))
               for attack, v in (("alie", 0.5 if alpha == 0.1 else 0.7), ("ipm", 0.6))]
    grid = GridFile("g", [], ("rule", "partition", "alpha", "worker-attack"), {}, axes)
    assert report_others(grid, results) == ()  # partition, alpha: in the columns
    (table,) = worst_cases(results, "top1", axes, ())
    assert {column: case and case.where for (_, column), case in table.cells.items()} == {
        "iid": "ipm", "dirichlet α=1": "ipm", "dirichlet α=0.1": "alie"}


def test_a_swept_bucket_size_is_part_of_the_defence_not_a_panel() -> None:
    axes = ReportAxes("defence", "worker-momentum", "worker-attack")
    results = [{"axes": {"rule": "geomed", "pre": "bucketing", "bucket-size": size,
                         "worker-momentum": 0.9, "worker-attack": attack},
                "defence": "bucketing+geomed" if size == 2 else f"bucketing(s={size})+geomed",
                "points": [{"top1": 0.5}]}
               for size in (2, 4) for attack in ("alie", "ipm")]
    grid = GridFile("g", [], ("rule", "pre", "bucket-size", "worker-momentum",
                              "worker-attack"), {}, axes)
    assert report_others(grid, results) == ()
    (table,) = worst_cases(results, "top1", axes, ())
    assert table.rows == ["bucketing+geomed", "bucketing(s=4)+geomed"]


def test_a_grid_files_worst_case_is_per_seed_then_over_seeds() -> None:
    axes = ReportAxes("rule", "worker-momentum", "worker-attack")
    results = [{"axes": {"rule": "krum", "worker-momentum": 0.9, "worker-attack": attack},
                "defence": "krum", "seed": seed, "points": [{"top1": v}]}
               for attack, values in (("alie", [0.5, 0.9, 0.5]), ("ipm", [0.9, 0.5, 0.9]))
               for seed, v in enumerate(values)]
    (table,) = worst_cases(results, "top1", axes, ())
    case = table.cells[("krum", "0.9")]
    assert case is not None
    assert (case.where, case.mean, case.std, case.seeds) == ("alie", 0.5, 0.0, 3)
