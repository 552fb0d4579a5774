"""``ps-experiment paper`` end to end on a quick grid: its files, and that a grid run
again computes only the cells it lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ps.experiments.cli import main
from ps.experiments.grid import GridSpec, paper_cells
from ps.experiments.runner import cell_path

pytestmark = pytest.mark.integration

QUICK = ["--dataset", "synthetic", "--rounds", "4", "--seeds", "1", "--rules", "mean,marmed",
         "--scenarios", "none,bitflip", "--no-sweeps", "--eval-every", "2"]


def test_a_quick_grid_writes_its_files_and_resumes_without_recomputing(tmp_path: Path) -> None:
    out = tmp_path / "grid"
    first = CliRunner().invoke(main, ["paper", "--out", str(out), *QUICK])
    assert first.exit_code == 0, first.output
    assert "4 cells: 0 cached, 4 to run" in first.output
    points = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(points) == 4 * 3  # rounds 0, 2, 4 of each cell
    report = (out / "report.md").read_text()
    assert "| mean | " in report and "| marmed | " in report and "bitflip" in report
    # an interrupted grid: one cell's result is missing; only that one is run again
    cells = paper_cells(GridSpec(dataset="synthetic", rounds=4, seeds=1,
                                 rules=("mean", "marmed"), scenarios=("none", "bitflip"),
                                 sweeps=False))
    kept = {c.key: cell_path(out, c).stat().st_mtime_ns for c in cells[1:]}
    cell_path(out, cells[0]).unlink()
    again = CliRunner().invoke(main, ["paper", "--out", str(out), *QUICK])
    assert again.exit_code == 0, again.output
    assert "4 cells: 3 cached, 1 to run" in again.output
    assert {c.key: cell_path(out, c).stat().st_mtime_ns for c in cells[1:]} == kept
    assert cell_path(out, cells[0]).exists()
