"""The worst-case heat map: one set of attacks per panel, named in its title; the spread
over seeds in each square; squares at and below chance marked apart; n/a squares."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ps.experiments.gridfile import ReportAxes
from ps.experiments.heatmap import (
    AT_CHANCE,
    BELOW_CHANCE,
    HATCHES,
    chance_mark,
    draw_table,
    square_text,
    worst_case_heatmap,
)
from ps.experiments.worstcase import WorstCase, worst_cases
from ps.plots.style import pyplot

AXES = ReportAxes("defence", "partition", "worker-attack")


def _runs(defence: str, attack: str, finals: list[float], partition: str = "iid"
          ) -> list[dict]:
    return [{"axes": {"rule": defence, "partition": partition, "worker-attack": attack},
             "defence": defence, "rule": defence, "seed": seed, "dataset": "fashion-mnist",
             "num_workers": 5, "num_byzantine": 1, "num_shards": 1, "rounds": 4,
             "scenario": attack,
             "points": [{"round": t, "top1": 0.1 + (v - 0.1) * t / 4} for t in (0, 2, 4)]}
            for seed, v in enumerate(finals)]


def _results() -> list[dict]:
    """Fashion-MNIST (chance 0.1): krum below chance under labelflip, mean at chance
    under inf, geomed above; geomed never faced labelflip (n/a)."""
    return [*_runs("krum", "inf", [0.60, 0.66]), *_runs("krum", "labelflip", [0.01, 0.03]),
            *_runs("mean", "inf", [0.10, 0.10]), *_runs("mean", "labelflip", [0.7, 0.7]),
            *_runs("geomed", "inf", [0.62, 0.70])]


@pytest.mark.parametrize(("mean", "mark"), [(0.011, BELOW_CHANCE), (0.089, BELOW_CHANCE),
                                            (0.098, AT_CHANCE), (0.1, AT_CHANCE),
                                            (0.109, AT_CHANCE), (0.12, None), (0.6, None),
                                            (math.nan, None)])
def test_a_mean_is_marked_at_or_below_chance(mean: float, mark: str | None) -> None:
    assert chance_mark(mean, 0.1) == mark


def test_a_square_shows_the_spread_over_seeds_of_the_per_seed_worst() -> None:
    case = WorstCase(0.63, 0.0412, 3, "alie", [])
    assert square_text(case) == "0.63\n±0.04\nalie"
    assert square_text(WorstCase(0.63, 0.0, 1, "alie", [])) == "0.63\nalie"  # one seed
    assert square_text(None) == "n/a"


def test_each_panel_is_one_attack_set_with_chance_marked() -> None:
    (table,) = [t for t in worst_cases(_results(), "top1", AXES, ())
                if t.panel.over == ("inf", "labelflip")]
    plt = pyplot()
    fig, ax = plt.subplots()
    draw_table(ax, table, AXES, 0.1)
    assert ax.get_title().replace("\n", " ") == "worst over worker-attack: inf, labelflip"
    texts = {t.get_text() for t in ax.texts}
    assert texts == {"0.02\n±0.01\nlabelflip", "0.10\n±0.00\ninf", "n/a"}
    hatches = sorted(p.get_hatch() for p in ax.patches)
    assert hatches == sorted([HATCHES[BELOW_CHANCE], HATCHES[AT_CHANCE]])
    plt.close(fig)


def test_the_heat_map_is_written(tmp_path: Path) -> None:
    results = _results()
    tables = worst_cases(results, "top1", AXES, ())
    assert {t.panel.over for t in tables} == {("inf", "labelflip"), ("inf",)}
    path = worst_case_heatmap(tmp_path, tables, AXES, results, "top1", "test top1")
    assert path == tmp_path / "worst-case.png" and path.stat().st_size > 0
