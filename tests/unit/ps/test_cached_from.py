"""``--cached-from``: the runs of a published results folder fill a grid's cache, so a
grid grown by seeds or sweeps computes only its new cells."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ps.experiments.grid import GridSpec, paper_cells
from ps.experiments.report import write_results
from ps.experiments.runner import CellRun, fill_cache, load_cell, run_cells


def _published(directory: Path, cells, engine: str | None = None) -> None:
    """A results folder holding a made-up run of each of ``cells``."""
    directory.mkdir()
    records = [{"key": c.key, **({"engine": engine} if engine else {}), "scenario": c.scenario,
                "rule": c.rule, "defence": c.defence, "q": c.run["q"], "seed": c.seed,
                "dataset": c.run["dataset"], "rounds": c.run["rounds"],
                "batch_size": c.run["batch_size"], "worker_momentum": 0.0,
                "params_sha256": "ab" * 32, "seconds": 1.0,
                **c.tags(), "points": [{"round": 0, "top1": 0.1, "top3": 0.3, "loss": 2.0},
                                       {"round": 4, "top1": 0.8, "top3": 0.9, "loss": 0.5}]}
               for c in cells]
    path = write_results(directory, records)
    (directory / "results.jsonl.gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()


def test_a_grid_grown_by_a_seed_computes_only_the_new_seeds_cells(
        tmp_path: Path, monkeypatch) -> None:
    from common.run import plugins

    # the cell processes load the plugins this process has: none here, whatever an
    # earlier test of the session loaded
    monkeypatch.setattr(plugins, "LOADED", {})
    spec = GridSpec(dataset="synthetic", rounds=4, num_workers=4, rules=("mean", "marmed"),
                    scenarios=("none",), sweeps=False)
    old = paper_cells(GridSpec(**{**spec.__dict__, "seeds": 1}))
    grown = paper_cells(GridSpec(**{**spec.__dict__, "seeds": 2}))
    _published(tmp_path / "published", old)
    out = tmp_path / "out"
    assert fill_cache(out, tmp_path / "published", grown) == len(old)
    assert fill_cache(out, tmp_path / "published", grown) == 0  # already there
    cached = load_cell(out, old[0])
    assert cached is not None and cached["points"][-1]["top1"] == 0.8
    assert "num_workers" not in cached  # a cell's tags are not its run's
    lines: list[str] = []
    results = run_cells(grown, CellRun(out, None, 2, None, jobs=1,
                                       cached_from=(tmp_path / "published",)), lines.append)
    assert f"{len(old)} cached, {len(grown) - len(old)} to run" in lines[1]
    assert [r["seed"] for r in results] == [c.seed for c in grown]
    assert {r["params_sha256"] for r in results if r["seed"] == 0} == {"ab" * 32}


def test_runs_of_another_engine_are_not_taken(tmp_path: Path) -> None:
    cells = paper_cells(GridSpec(dataset="synthetic", rounds=4, num_workers=4, seeds=1,
                                 rules=("mean",), scenarios=("none",), sweeps=False))
    _published(tmp_path / "published", cells, engine="cluster")
    assert fill_cache(tmp_path / "out", tmp_path / "published", cells) == 0


def test_cached_only_reports_the_runs_so_far_and_counts_the_rest(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ps.experiments.cli import main

    spec = GridSpec(dataset="synthetic", rounds=4, num_workers=4, seeds=1,
                    rules=("mean", "marmed"), scenarios=("none",), sweeps=False)
    _published(tmp_path / "published", paper_cells(spec))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "paper", "--out", str(out), "--dataset", "synthetic", "--rounds", "4",
        "--workers", "4", "--rules", "mean,marmed", "--scenarios", "none", "--no-sweeps",
        "--seeds", "3", "--cached-from", str(tmp_path / "published"), "--cached-only"])
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    assert "**Unfinished**: 4 of the grid's 6 distinct runs are not run yet" in report
    assert not list((out / "cells").glob("*.tmp"))
    assert len(list((out / "cells").glob("*.json"))) == 2  # nothing run
    assert json.loads((out / "grid.json").read_text())["not_run"] == 4


def test_only_cells_run_on_this_machine_are_verified_through_the_cluster(
        tmp_path: Path, monkeypatch) -> None:
    from ps.experiments import runner

    cells = paper_cells(GridSpec(dataset="synthetic", rounds=4, num_workers=4, seeds=2,
                                 rules=("mean",), scenarios=("none",), sweeps=False))
    here, there = runner.machine(), "another CPU; torch 0; numpy 0"
    results = [{"key": c.key, "params_sha256": "ab", "machine": m}
               for c, m in zip(cells, (there, here), strict=True)]
    ran: list[list[str]] = []
    monkeypatch.setattr(runner, "run_cells", lambda chosen, how, progress: ran.append(
        [c.key for c in chosen]) or [{"params_sha256": "ab"} for _ in chosen])
    checked = runner.verify_sample(cells, results, 2, CellRun(tmp_path, None, 2, None))
    assert ran == [[cells[1].key]] and [c["same"] for c in checked] == [True]
    lines: list[str] = []
    assert runner.verify_sample(cells, [*results[:1], {**results[1], "machine": there}], 2,
                                CellRun(tmp_path, None, 2, None), lines.append) == []
    assert "no cell was run on this machine" in lines[0]


def test_a_machine_is_named_by_what_its_rounding_depends_on() -> None:
    """Two hosts sold as one CPU model can dispatch to other vector units (runs of one
    such name did not reproduce each other's bits): the CPU's flags and torch's
    capability are part of the name."""
    import torch

    from ps.experiments import runner

    name = runner.machine()
    assert f"{torch.__version__} {torch.backends.cpu.get_cpu_capability()};" in name
    if Path("/proc/cpuinfo").exists():
        assert " flags " in name and "family " in name
