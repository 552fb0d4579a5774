"""A grid run under ``--validation`` reports its figures as the validation split's, not
the test set's."""

from __future__ import annotations

from pathlib import Path

from ps.experiments.filereport import write_file_report
from ps.experiments.grid import evaluated_on
from ps.experiments.report import ReportInfo
from tests.unit.ps.test_rebuild import FILE_GRID, file_results


def _report(out: Path, results: list[dict]) -> str:
    info = ReportInfo("ps-experiment run tiny.toml", 1.0, "top1", "reference", [])
    return write_file_report(out, results, info, FILE_GRID).read_text(encoding="utf-8")


def test_the_report_names_the_validation_split(tmp_path: Path) -> None:
    results = [{**r, "validation": 0.1} for r in file_results()]
    text = _report(tmp_path, results)
    assert "* Evaluation set: a validation split of the training set, not the test set " \
           "(`--validation 0.1`, every run)" in text
    assert "## Final validation top1 (mean ± std over seeds)" in text
    assert "## Worst case over worker-attack: final validation top1" in text
    assert "final test" not in text.lower()


def test_without_it_the_report_is_the_test_sets(tmp_path: Path) -> None:
    text = _report(tmp_path, file_results())
    assert "## Final test top1" in text and "validation" not in text


def test_a_grid_of_both_says_so() -> None:
    results = file_results()
    assert evaluated_on(results) == "test"
    assert evaluated_on([{**results[0], "validation": 0.2}, results[1]]) == \
        "test and validation"


def test_a_cluster_run_under_validation_says_so_when_it_ends() -> None:
    from ps.launcher.cli import summary_line
    from ps.launcher.report import Progress

    p = Progress(round=5, top1=0.5, top3=0.75, loss=1.25)
    assert summary_line(5, 2.0, p, "validation").endswith(
        "; validation top-1 0.5000, top-3 0.7500, loss 1.2500")
