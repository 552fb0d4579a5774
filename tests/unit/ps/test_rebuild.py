"""``ps-experiment report DIR``: a finished grid's report rebuilt from its
``results.jsonl`` (plain or gzip) and ``grid.json`` alone, the same bytes as the run's;
and the grids published under ``docs/results/`` give the tables committed beside them."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ps.experiments.cli import main
from ps.experiments.gridfile import GridFile, ReportAxes
from ps.experiments.rebuild import (
    GRID_JSON,
    RESULTS,
    VERIFY_FILE,
    file_grid,
    modern_grid,
    paper_grid,
    read_results,
    regenerate,
    render,
    write_grid,
)
from ps.experiments.report import ReportInfo, write_results

PUBLISHED = Path(__file__).resolve().parents[3] / "docs" / "results"


def _record(seed: int, final: float, **fields) -> dict:
    points = [{"round": t, "top1": 0.1 + (final - 0.1) * t / 4, "top3": 0.5,
               "loss": math.nan if final == 0 else 1.0 - final} for t in (0, 2, 4)]
    return {"key": f"k{seed}{fields}", "rule": "mean", "defence": "mean", "q": 1,
            "worker_momentum": 0.0, "batch_size": 32, "seed": seed, "rounds": 4,
            "dataset": "synthetic", "seconds": 1.5, "params_sha256": "ab" * 32,
            "num_workers": 5, "num_byzantine": 0 if fields.get("scenario") == "none" else 1,
            "num_shards": 4, "points": points, **fields}


def paper_results() -> list[dict]:
    return [_record(s, v + 0.01 * s, figure="paper", scenario=scenario, rule=rule,
                    defence=rule)
            for s in (0, 1, 2) for scenario, rule, v in (
                ("none", "mean", 0.8), ("none", "marmed", 0.78), ("bitflip", "mean", 0.0),
                ("bitflip", "marmed", 0.77))]


def modern_results() -> list[dict]:
    return [_record(s, v, figure="modern", scenario=attack, defence=defence,
                    worker_momentum=beta)
            for s in (0, 1) for beta in (0.0, 0.9) for attack, defence, v in (
                ("none", "mean", 0.8), ("inf", "mean", 0.0),
                ("none", "nnm+trimmed-mean", 0.79), ("inf", "nnm+trimmed-mean", 0.7))]


FILE_GRID = GridFile("tiny.toml", [], ("rule", "worker-attack", "worker-momentum"), {},
                     ReportAxes("rule", "worker-momentum", "worker-attack"))


def file_results() -> list[dict]:
    return [_record(s, v, figure="grid", scenario="", rule=rule, defence=rule,
                    axes={"rule": rule, "worker-attack": attack, "worker-momentum": beta})
            for s in (0, 1) for beta in (0.0, 0.9) for rule in ("mean", "krum")
            for attack, v in (("none", 0.8), ("inf", 0.0 if rule == "mean" else 0.6))]


GRIDS = {"paper": (paper_results, paper_grid()),
         "modern": (modern_results, modern_grid(("none", "inf"), 5)),
         "file": (file_results, file_grid(FILE_GRID))}


def _run(out: Path, kind: str) -> str:
    """What a grid run leaves (results.jsonl, grid.json, verify.json, the report)."""
    make, grid = GRIDS[kind]
    out.mkdir()
    results = make()
    write_results(out, results)
    checked = [{"label": "paper/none/mean/seed 0", "reference": "ab" * 32,
                "cluster": "ab" * 32, "same": True}]
    (out / VERIFY_FILE).write_text(json.dumps(checked))
    info = ReportInfo("ps-experiment x --out y", 12.3, "top1", "reference", [], checked)
    write_grid(out, grid, info)
    return render(out, results, info, grid).read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", list(GRIDS))
def test_results_jsonl_reads_back_the_records_it_was_written_from(tmp_path: Path,
                                                                   kind: str) -> None:
    results = GRIDS[kind][0]()
    write_results(tmp_path, results)
    again = read_results(tmp_path)
    assert len(again) == len(results)
    for a, b in zip(again, results, strict=True):
        assert {k: v for k, v in a.items() if k != "points"} == \
            {k: v for k, v in b.items() if k != "points"}
        assert [p["round"] for p in a["points"]] == [0, 2, 4]
        assert [p["top1"] for p in a["points"]] == [p["top1"] for p in b["points"]]


def test_a_cell_listed_twice_reads_back_as_two_records(tmp_path: Path) -> None:
    twice = paper_results()[:1] * 2  # a grid may list one cell twice (--rules mean,mean)
    write_results(tmp_path, twice)
    assert [len(r["points"]) for r in read_results(tmp_path)] == [3, 3]


@pytest.mark.parametrize("kind", list(GRIDS))
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_report_regenerates_the_run_report_from_results_alone(tmp_path: Path, kind: str,
                                                              packed: bool) -> None:
    original = _run(tmp_path / "run", kind)
    kept = tmp_path / "kept"  # what a repository holds: no cells/, no figures
    kept.mkdir()
    for name in (GRID_JSON, VERIFY_FILE):
        shutil.copy(tmp_path / "run" / name, kept / name)
    data = (tmp_path / "run" / RESULTS).read_bytes()
    if packed:
        (kept / f"{RESULTS}.gz").write_bytes(gzip.compress(data))
    else:
        (kept / RESULTS).write_bytes(data)
    result = CliRunner().invoke(main, ["report", str(kept)])
    assert result.exit_code == 0, result.output
    assert (kept / "report.md").read_text(encoding="utf-8") == original
    pngs = sorted(p.name for p in (tmp_path / "run").glob("*.png"))
    assert pngs and sorted(p.name for p in kept.glob("*.png")) == pngs


def test_a_directory_without_grid_json_is_refused_in_one_line(tmp_path: Path) -> None:
    write_results(tmp_path, paper_results())
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 2 and f"no {GRID_JSON}" in result.output


def _published() -> list[Path]:
    return sorted(d for d in PUBLISHED.glob("*/") if (d / "report.md").exists() and (
        (d / RESULTS).exists() or (d / f"{RESULTS}.gz").exists()))


def _tables(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


@pytest.mark.skipif(not _published(), reason="no docs/results/<grid>/ with a results.jsonl "
                    "and a report.md committed yet")
@pytest.mark.parametrize("directory", _published(), ids=lambda d: d.name)
def test_the_published_tables_are_what_the_published_results_give(
        tmp_path: Path, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables only: the figures (most of a rebuild's time) are not drawn here; the
    rebuild tests above draw them."""
    import ps.experiments.figures as figures
    import ps.experiments.heatmap as heatmap

    def named(name: str):
        return lambda out, *args, **kwargs: out / name

    monkeypatch.setattr(figures, "draw_all", lambda out, *args, **kwargs: [])
    monkeypatch.setattr(figures, "worst_case_curves", named("worst-curves.png"))
    monkeypatch.setattr(heatmap, "worst_case_heatmap", named("worst-case.png"))
    regenerated = regenerate(directory, tmp_path).read_text(encoding="utf-8")
    committed = (directory / "report.md").read_text(encoding="utf-8")
    assert _tables(regenerated) == _tables(committed)


def _rows(text: str) -> list[str]:
    """A markdown text's table rows, less the header separators."""
    return [line.strip() for line in _tables(text) if not set(line) <= set("|-: ")]


def test_every_table_row_of_docs_results_md_is_a_published_reports() -> None:
    """docs/results.md shows the published reports' tables, not numbers typed by hand:
    each of its table rows (headers included) is a row of some
    ``docs/results/<grid>/report.md``, or of the ByzFL comparison's (which
    ``test_byzfl_compare`` checks against its ``agreement.json``)."""
    quoted = [*_published(), PUBLISHED / "byzfl"]
    published = {row for d in quoted
                 for row in _rows((d / "report.md").read_text(encoding="utf-8"))}
    page = (PUBLISHED.parent / "results.md").read_text(encoding="utf-8")
    assert [row for row in _rows(page) if row not in published] == []


@pytest.mark.parametrize("directory", [d for d in _published() if (d / GRID_JSON).exists()],
                         ids=lambda d: d.name)
def test_each_published_grid_holds_the_grid_file_whose_cells_are_its_runs(
        directory: Path) -> None:
    """A reader reruns a published grid from its own folder: ``grid.toml`` beside the
    results, every run of the results one of its cells (an unfinished grid, published
    with ``--cached-only``, has fewer runs than cells)."""
    from ps.experiments.gridfile import load_grid

    keys = {c.key for c in load_grid(directory / "grid.toml").cells}
    runs = {r["key"] for r in read_results(directory)}
    assert runs <= keys
    grid = json.loads((directory / GRID_JSON).read_text(encoding="utf-8"))
    assert len(keys) - len(runs) == grid.get("not_run", 0)
