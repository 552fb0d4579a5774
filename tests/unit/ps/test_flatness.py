"""Whether a curve has flattened by its last round: the line through the last third of
the run moves by less than 0.01 per tenth of it and no evaluation lies 0.02 from it, on
the curve averaged over seeds; the count of the flat cells per split in the report of a
grid file with splits."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ps.experiments.filereport import write_file_report
from ps.experiments.flatness import (
    cell_flatness,
    every_seed_flat,
    flatness,
    flatness_lines,
)
from ps.experiments.gridfile import GridFile, ReportAxes
from ps.experiments.report import ReportInfo
from tests.unit.ps.test_rebuild import FILE_GRID, file_results

ROUNDS = [0, 25, 50, 75, 100, 125, 150]


def _run(values: list[float], seed: int = 0) -> dict:
    return {"seed": seed, "rounds": ROUNDS[-1],
            "points": [{"round": t, "top1": v} for t, v in zip(ROUNDS, values, strict=True)]}


def test_a_plateau_with_noise_is_flat() -> None:
    end = flatness(ROUNDS, [0.1, 0.6, 0.7, 0.75, 0.795, 0.805, 0.798], 150)
    assert end is not None and end.flat
    assert end.rounds == (100, 125, 150)  # the last third of the run


def test_a_curve_still_climbing_drifts() -> None:
    """+0.012 per 15 rounds (a tenth of the run) at the end: not flat, though each step
    is small."""
    end = flatness(ROUNDS, [0.1, 0.5, 0.6, 0.66, 0.70, 0.72, 0.74], 150)
    assert end is not None and end.drifting and not end.swinging and not end.flat
    assert end.drift == pytest.approx(0.012)


def test_a_curve_that_oscillates_swings() -> None:
    end = flatness(ROUNDS, [0.1, 0.4, 0.5, 0.45, 0.50, 0.60, 0.50], 150)
    assert end is not None and end.swinging and not end.drifting and not end.flat
    assert end.swing == pytest.approx(0.1 * 2 / 3)


def test_the_window_is_the_last_third_of_the_run() -> None:
    """A steep climb before round 100 of 150 is not held against the curve."""
    rounds = list(range(0, 151, 5))
    values = [0.1 + 0.007 * t if t < 100 else 0.80 for t in rounds]
    end = flatness(rounds, values, 150)
    assert end is not None and end.flat and end.rounds[0] == 100


def test_too_few_evaluations_are_not_judged_and_a_diverged_curve_is_not_flat() -> None:
    assert flatness([0, 150], [0.1, 0.8], 150) is None
    end = flatness(ROUNDS, [0.1, 0.5, 0.6, 0.7, 0.8, math.nan, 0.8], 150)
    assert end is not None and not end.flat


def test_seeds_are_averaged_before_the_test() -> None:
    """Two seeds swinging in opposite phase: their mean is flat, neither seed is."""
    runs = [_run([0.1, 0.5, 0.6, 0.7, 0.75, 0.85, 0.75], 0),
            _run([0.1, 0.5, 0.6, 0.7, 0.85, 0.75, 0.85], 1)]
    end = cell_flatness(runs, "top1")
    assert end is not None and end.flat
    assert not every_seed_flat(runs, "top1")


def test_the_report_counts_the_flat_cells_and_lists_the_others() -> None:
    flat = [_run([0.1, 0.6, 0.7, 0.75, 0.8, 0.8, 0.8], s) for s in (0, 1)]
    climbing = [_run([0.1, 0.5, 0.6, 0.66, 0.70, 0.72, 0.74], s) for s in (0, 1)]
    cells = {("iid", "0.9", "krum", "alie"): flat, ("iid", "0.9", "krum", "ipm"): climbing,
             ("iid", "0", "krum", "alie"): flat}
    axes = ("heterogeneity", "worker-momentum", "defence", "worker-attack")
    lines = flatness_lines(cells, axes, 2, "top1", "test top1")
    assert "| heterogeneity | worker-momentum | cells | flat | drifting | swinging | " \
           "flat on every seed | median drift |" in lines
    assert "| iid | 0.9 | 2 | 1 | 1 | 0 | 1 | +0.006 |" in lines
    assert "| iid | 0 | 1 | 1 | 0 | 0 | 1 | +0.000 |" in lines
    assert "* heterogeneity = iid, worker-momentum = 0.9, defence = krum: ipm (+0.012, " \
           "0.000)" in lines


def _partitioned(report: ReportAxes | None) -> tuple[list[dict], GridFile]:
    """Two splits x two rules x two attacks: the iid curves flatten, the extreme ones
    still climb."""
    results = [{**_run([0.1, 0.6, 0.7, 0.75, 0.8, 0.8, 0.8] if split == "iid" else
                       [0.1, 0.5, 0.6, 0.66, 0.70, 0.72, 0.74], seed),
                "key": f"{split}-{rule}-{attack}-{seed}", "seconds": 1.0, "rule": rule,
                "defence": rule, "scenario": attack, "worker_momentum": 0.9,
                "dataset": "fashion-mnist",
                "num_workers": 5, "num_byzantine": 1, "num_shards": 1, "figure": "grid",
                "axes": {"rule": rule, "partition": split, "worker-attack": attack}}
               for split in ("iid", "extreme") for rule in ("mean", "krum")
               for attack in ("alie", "ipm") for seed in (0, 1)]
    return results, GridFile("het.toml", [], ("rule", "partition", "worker-attack"), {},
                             report)


@pytest.mark.parametrize(("report", "row"), [
    (None, "rule"), (ReportAxes("defence", "heterogeneity", "worker-attack"), "defence")],
    ids=["alone", "with-report"])
def test_a_grid_with_splits_reports_how_many_curves_flattened_per_split(
        tmp_path: Path, report: ReportAxes | None, row: str) -> None:
    results, grid = _partitioned(report)
    info = ReportInfo("ps-experiment run het.toml", 1.0, "top1", "reference", [])
    text = write_file_report(tmp_path, results, info, grid).read_text(encoding="utf-8")
    assert "## Flatness at the last round: test top1" in text
    assert "(at least its last 3 evaluations; here rounds 100, 125, 150)" in text
    assert "| iid | 4 | 4 | 0 | 0 | 4 | +0.000 |" in text
    assert "| extreme | 4 | 0 | 4 | 0 | 0 | +0.012 |" in text
    assert f"* heterogeneity = extreme, {row} = krum: alie (+0.012, 0.000), ipm (+0.012, " \
           "0.000)" in text


def test_a_grid_without_splits_has_no_flatness_table(tmp_path: Path) -> None:
    info = ReportInfo("ps-experiment run tiny.toml", 1.0, "top1", "reference", [])
    text = write_file_report(tmp_path, file_results(), info, FILE_GRID).read_text()
    assert "Flatness" not in text
