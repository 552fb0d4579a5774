"""A grid file's worst-case tables: one set of attacks per table, n/a where a cell ran
part of it, the spread over seeds of the per-seed worst."""

from __future__ import annotations

import pytest

from ps.experiments.gridfile import ReportAxes
from ps.experiments.worstcase import WorstCase, at_round, round_tables, worst_cases, worst_tables

AXES = ReportAxes("defence", "partition", "worker-attack")
OTHERS = ("worker-momentum",)


def _runs(defence: str, beta: float, attack: str, finals: list[float],
          partition: str = "iid") -> list[dict]:
    return [{"axes": {"rule": defence, "partition": partition, "worker-momentum": beta,
                      "worker-attack": attack},
             "defence": defence, "seed": seed, "points": [{"top1": v}]}
            for seed, v in enumerate(finals)]


def _results() -> list[dict]:
    """Momentum 0.9: krum and mean against none, alie, ipm (ipm the worst); momentum 0:
    against none and alie only."""
    return [*_runs("krum", 0.9, "none", [0.8, 0.8]), *_runs("krum", 0.9, "alie", [0.6, 0.7]),
            *_runs("krum", 0.9, "ipm", [0.2, 0.3]),
            *_runs("mean", 0.9, "none", [0.8, 0.8]), *_runs("mean", 0.9, "alie", [0.7, 0.7]),
            *_runs("mean", 0.9, "ipm", [0.4, 0.4]),
            *_runs("krum", 0.0, "none", [0.7, 0.7]), *_runs("krum", 0.0, "alie", [0.5, 0.6])]


def _sets(tables) -> list[tuple[tuple, tuple]]:
    return [(t.panel.fixed, t.panel.over) for t in tables]


def test_a_table_never_mixes_attack_sets() -> None:
    tables = worst_cases(_results(), "top1", AXES, OTHERS)
    assert _sets(tables) == [
        ((("worker-momentum", "0.9"),), ("none", "alie", "ipm")),
        ((("worker-momentum", "0.9"),), ("none", "alie")),  # beside momentum 0, same set
        ((("worker-momentum", "0"),), ("none", "alie"))]
    for table in tables:
        for case in table.cells.values():
            assert case is not None and case.where in table.panel.over
    beside = tables[1]  # momentum 0.9 over none and alie: ipm is not its worst
    assert (beside.rows, beside.columns) == (["krum"], ["iid"])  # momentum 0's
    krum = beside.cells[("krum", "iid")]
    assert krum is not None and (krum.where, krum.mean) == ("alie", pytest.approx(0.65))
    mixed = tables[0].cells[("krum", "iid")]  # over none, alie, ipm
    assert mixed is not None and mixed.where == "ipm"
    assert tables[1].panel.title("worker-attack") == \
        "worker-momentum = 0.9; worst over worker-attack: none, alie"


def test_a_defence_missing_one_attack_of_the_set_is_not_applicable() -> None:
    results = [r for r in _results() if not (r["defence"] == "mean"
                                             and r["axes"]["worker-attack"] == "ipm")]
    tables = worst_cases(results, "top1", AXES, OTHERS)
    full = next(t for t in tables if t.panel.over == ("none", "alie", "ipm"))
    assert full.cells[("mean", "iid")] is None  # not a worst case over none and alie
    assert isinstance(full.cells[("krum", "iid")], WorstCase)
    lines = worst_tables(tables, AXES, "test top1")
    title = "### worker-momentum = 0.9; worst over worker-attack: none, alie, ipm"
    table = lines[lines.index(title) + 4:lines.index(title) + 6]
    assert table == ["| krum | 0.250 ± 0.071 (ipm; ~ none) |", "| mean | n/a |"]
    # mean's own set makes a table of its own, krum in it over the same two attacks
    pair = next(t for t in tables if t.panel.over == ("none", "alie")
                and t.panel.fixed == (("worker-momentum", "0.9"),))
    assert {k: c.where for k, c in pair.cells.items() if c} == {
        ("krum", "iid"): "alie", ("mean", "iid"): "alie"}


def test_a_cell_not_run_is_absent_and_shown_as_such() -> None:
    results = _results() + _runs("krum", 0.9, "none", [0.5, 0.5], partition="extreme")
    tables = worst_cases(results, "top1", AXES, OTHERS)
    alone = next(t for t in tables if t.panel.over == ("none",)
                 and t.panel.fixed == (("worker-momentum", "0.9"),))
    assert ("mean", "extreme") not in alone.cells  # mean never ran on extreme
    lines = worst_tables(tables, AXES, "test top1")
    assert "| mean | 0.800 ± 0.000 (none) | - |" in lines


def test_the_spread_is_over_seeds_of_the_per_seed_worst() -> None:
    """alie worst on seeds 0 and 2, ipm on seed 1: the per-seed worst is 0.5 on every
    seed (spread 0), where the means (0.63, 0.77) would give neither."""
    results = [*_runs("krum", 0.9, "alie", [0.5, 0.9, 0.5]),
               *_runs("krum", 0.9, "ipm", [0.9, 0.5, 0.9])]
    (table,) = worst_cases(results, "top1", AXES, OTHERS)
    case = table.cells[("krum", "iid")]
    assert case is not None
    assert (case.where, case.mean, case.std, case.seeds) == ("alie", 0.5, 0.0, 3)


def test_a_baseline_is_in_no_worst_case() -> None:
    """Without attack krum ends at 0.1 on seed 0, below every attack: with ``none`` as the
    baseline the worst case is over the attacks alone (alie, then ipm) and says so."""
    results = [*_runs("krum", 0.9, "none", [0.1, 0.8]), *_runs("krum", 0.9, "alie", [0.6, 0.7]),
               *_runs("krum", 0.9, "ipm", [0.5, 0.9])]
    (counted,) = worst_cases(results, "top1", AXES, OTHERS)
    assert counted.panel.over == ("none", "alie", "ipm")
    assert counted.cells[("krum", "iid")].mean == pytest.approx((0.1 + 0.7) / 2)
    axes = ReportAxes("defence", "partition", "worker-attack", baseline="none")
    (table,) = worst_cases(results, "top1", axes, OTHERS)
    case = table.cells[("krum", "iid")]
    assert table.panel.over == ("alie", "ipm")
    assert case is not None and case.mean == pytest.approx((0.5 + 0.7) / 2)
    assert "none" not in (case.ties or [])
    text = " ".join(worst_tables([table], axes, "test top1"))
    assert "worker-attack = none is the baseline, in no worst case" in text
    assert "worst over worker-attack: alie, ipm" in text


def _curve(defence: str, attack: str, by_seed: list[tuple[float, float]]) -> list[dict]:
    """Runs evaluated at rounds 10 and 20: (at 10, at 20) per seed."""
    return [{"axes": {"rule": defence, "partition": "iid", "worker-momentum": 0.9,
                      "worker-attack": attack},
             "defence": defence, "seed": seed,
             "points": [{"round": 10, "top1": a}, {"round": 20, "top1": b}]}
            for seed, (a, b) in enumerate(by_seed)]


def test_an_earlier_rounds_worst_case_is_set_beside_the_final_one_paired_by_seed() -> None:
    """krum's worst case falls from 0.6 at round 10 to 0.3 at round 20 on every seed
    (by 0.3 +- 0.01: decisively), mean's holds (its change's interval holds 0)."""
    results = [*_curve("krum", "alie", [(0.60, 0.30), (0.61, 0.30), (0.60, 0.31)]),
               *_curve("krum", "ipm", [(0.9, 0.9)] * 3),
               *_curve("mean", "alie", [(0.70, 0.71), (0.72, 0.70), (0.70, 0.70)]),
               *_curve("mean", "ipm", [(0.9, 0.9)] * 3)]
    axes = ReportAxes("defence", "partition", "worker-attack", at_rounds=(10,))
    lines = round_tables(worst_cases(results, "top1", axes, OTHERS), results, "top1", axes, OTHERS,
                         "test top1")
    assert "## Worst case over worker-attack at round 10 and at the end: test top1" in lines
    krum = next(line for line in lines if line.startswith("| krum |"))
    assert krum.startswith("| krum | 0.603 → 0.303, -0.300 [")
    low, high = (float(x) for x in krum.split("[")[1].rstrip("] |").split(", "))
    assert high < 0
    mean = next(line for line in lines if line.startswith("| mean |"))
    low, high = (float(x) for x in mean.split("[")[1].rstrip("] |").split(", "))
    assert low < 0 < high
    assert [len(r["points"]) for r in at_round(results, 10)] == [1] * len(results)
    assert at_round(results, 15) == []  # no evaluation at round 15


def test_a_round_without_evaluations_is_said_and_a_missing_seed_is_counted() -> None:
    axes = ReportAxes("defence", "partition", "worker-attack", at_rounds=(15,))
    results = [*_curve("krum", "alie", [(0.6, 0.3)] * 3), *_curve("krum", "ipm", [(0.9, 0.9)] * 3)]
    lines = round_tables(worst_cases(results, "top1", axes, OTHERS), results, "top1", axes, OTHERS,
                         "test top1")
    assert "No run was evaluated at round 15" in " ".join(lines)
    assert not any(line.startswith("| krum |") for line in lines)
    # seed 2 has no evaluation at round 10: both sides over seeds 0 and 1, and said
    for r in results:
        if r["seed"] == 2:
            r["points"] = r["points"][1:]
    axes = ReportAxes("defence", "partition", "worker-attack", at_rounds=(10,))
    lines = round_tables(worst_cases(results, "top1", axes, OTHERS), results, "top1", axes, OTHERS,
                         "test top1")
    krum = next(line for line in lines if line.startswith("| krum |"))
    assert krum.startswith("| krum | 0.600 → 0.300, -0.300") and "(2 of 3 seeds)" in krum
