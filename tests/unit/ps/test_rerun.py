"""The rerun of published results (``ps/experiments/rerun.py``, ``scripts/rerun_results.py``):
seeds cut in a grid file, the ledger adding up time across invocations, the bit-for-bit
comparison counting only runs of this machine, and a real rerun of a published grid."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import ConfigError
from ps.experiments.rerun import (
    CUT,
    LEDGER,
    Folder,
    Ledger,
    compare,
    published_folders,
    rerun,
    seeds_kept,
    summary,
    with_seeds,
)
from ps.experiments.runner import machine

ROOT = Path(__file__).resolve().parents[3]
GRID = """# a tiny grid
dataset = "synthetic"
workers = 4
q = 1
rounds = 3
seeds = {seeds}
rule = ["mean", "marmed"]
"""


def test_with_seeds_keeps_the_first_k_of_a_count_or_a_list() -> None:
    assert "seeds = [0, 1]" in with_seeds(GRID.format(seeds=5), 2)
    assert "seeds = [100, 101]" in with_seeds(GRID.format(seeds="[100, 101, 102]"), 2)
    assert with_seeds(GRID.format(seeds=5), None) == GRID.format(seeds=5)
    assert "seeds = [3, 4]  # cut by the rerun: the last 2" in with_seeds(
        GRID.format(seeds=5), 2, last=True)
    with pytest.raises(ValueError, match="fewer than 6"):
        with_seeds(GRID.format(seeds=5), 6)
    with pytest.raises(ValueError, match="no seeds"):
        with_seeds('rule = "mean"\n', 1)
    assert with_seeds('seeds = [\n  7,  # a comment\n  8,\n]\nrule = "mean"\n', 1) == (
        'seeds = [7]  # cut by the rerun: the first 1\nrule = "mean"\n')


def test_the_cut_takes_the_fewer_seeds() -> None:
    assert seeds_kept("paper", None, cut=False) is None
    assert seeds_kept("paper", None, cut=True) == CUT["paper"]
    assert seeds_kept("paper", 1, cut=True) == 1
    assert seeds_kept("mnist", None, cut=True) is None


def test_compare_counts_only_runs_of_this_machine_bit_for_bit() -> None:
    here = machine()
    published = [{"key": "a", "params_sha256": "1", "machine": here},
                 {"key": "b", "params_sha256": "2", "machine": here},
                 {"key": "c", "params_sha256": "3", "machine": "another CPU"},
                 {"key": "d", "params_sha256": "4"}]  # before machines were recorded
    rerun_ = [{"key": k, "params_sha256": v} for k, v in
              [("a", "1"), ("b", "x"), ("c", "3"), ("d", "4"), ("e", "5")]]
    assert compare(rerun_, published, here) == {
        "identical": 1, "different": 1, "other_machine": 2, "other_machine_identical": 2,
        "unpublished": 1}


def _published(tmp_path: Path, seeds: int) -> Path:
    """A results folder published by ps-experiment run from a grid of ``seeds`` seeds."""
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    grid = results / "tiny" / "grid.toml"
    grid.write_text(GRID.format(seeds=seeds), encoding="utf-8")
    subprocess.run([sys.executable, "-m", "ps.experiments.cli", "run", str(grid), "--out",
                    str(results / "tiny"), "--jobs", "1"], check=True, cwd=ROOT,
                   capture_output=True)
    (results / "notes").mkdir()  # no grid file: not a rerun
    return results


def test_a_stopped_rerun_resumes_and_adds_up_its_time(tmp_path: Path) -> None:
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    (results / "tiny" / "grid.toml").write_text(GRID.format(seeds=4), encoding="utf-8")
    folders = published_folders(results)
    assert folders == [Folder("tiny", results / "tiny", False)]
    out = tmp_path / "rerun"
    calls: list[list[str]] = []
    ledger = rerun(folders, out, seeds=2, cut=False, jobs=1, data_dir=None,
                   progress=lambda _: None, run=lambda argv: calls.append(argv) or 1)
    entry = ledger.folders["tiny"]
    assert not entry["finished"] and entry["cells"] == 4 and entry["all_cells"] == 8
    assert "seeds = [0, 1]" in (out / "tiny.toml").read_text(encoding="utf-8")
    first = entry["seconds"]
    assert json.loads((out / LEDGER).read_text())["tiny"]["seconds"] == first
    # resumed (another session): the time adds up; a changed seed count starts anew
    again = rerun(folders, out, seeds=2, cut=False, jobs=1, data_dir=None,
                  progress=lambda _: None, run=lambda argv: 1)
    assert again.folders["tiny"]["seconds"] >= first and len(calls) == 1
    other = Ledger(out / LEDGER).entry("tiny", 3, 6, 8)
    assert other["seconds"] == 0.0 and other["seeds"] == 3


def test_a_running_grids_time_is_in_the_ledger_before_it_ends(tmp_path: Path) -> None:
    """Saved while the grid runs: a rerun killed outright (its session over) loses at
    most the last interval of the time its cached cells took."""
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    (results / "tiny" / "grid.toml").write_text(GRID.format(seeds=1), encoding="utf-8")
    out = tmp_path / "rerun"
    seen: list[float] = []

    def slow_grid(argv: list[str]) -> int:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            if (out / LEDGER).exists():
                seconds = json.loads((out / LEDGER).read_text())["tiny"]["seconds"]
                if seconds > 0:
                    seen.append(seconds)
            time.sleep(0.01)
        return 1  # stopped

    ledger = rerun(published_folders(results), out, seeds=None, cut=False, jobs=1,
                   data_dir=None, progress=lambda _: None, run=slow_grid, save_every=0.05)
    assert seen and 0 < seen[0] <= ledger.folders["tiny"]["seconds"]


def test_a_grown_grid_is_timed_afresh_without_its_old_cache(tmp_path: Path) -> None:
    """A folder finished before its grid grew (2 cells, now 4 a seed): its entry starts
    again at zero, and the old cache is cleared, so that the cells it held are timed."""
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    (results / "tiny" / "grid.toml").write_text(GRID.format(seeds=1), encoding="utf-8")
    out = tmp_path / "rerun"
    out.mkdir()
    before = Ledger(out / LEDGER)
    before.entry("tiny", None, 2, 2).update(seconds=60.0, finished=True)  # its rerun, done
    before.save()
    (out / "tiny" / "cells").mkdir(parents=True)  # what that run cached
    skipped: list[str] = []
    rerun(published_folders(results), out, seeds=None, cut=False, jobs=1, data_dir=None,
          progress=skipped.append, run=lambda argv: pytest.fail("ran"))
    assert "finished before" in skipped[0]  # the same grid: nothing to do
    grown = GRID.format(seeds=1).replace('"marmed"]', '"marmed", "meamed", "geomed"]')
    (results / "tiny" / "grid.toml").write_text(grown, encoding="utf-8")
    said: list[str] = []
    cache_when_run: list[bool] = []
    ledger = rerun(published_folders(results), out, seeds=None, cut=False, jobs=1,
                   data_dir=None, progress=said.append,
                   run=lambda argv: cache_when_run.append((out / "tiny").exists()) or 1)
    entry = ledger.folders["tiny"]
    assert entry["cells"] == 4 and not entry["finished"] and entry["seconds"] < 60
    assert any("cleared" in line for line in said) and cache_when_run == [False]


def test_a_grid_that_reads_a_data_dir_is_skipped_without_one(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    (folder / "grid.toml").write_text(GRID.format(seeds=1), encoding="utf-8")
    (folder / "grid.json").write_text(json.dumps(
        {"command": "ps-experiment run grid.toml --data-dir /data --out x"}))
    [found] = published_folders(tmp_path)
    assert found.needs_data_dir
    said: list[str] = []
    ledger = rerun([found], tmp_path / "rerun", seeds=None, cut=False, jobs=1,
                   data_dir=None, progress=said.append, run=lambda argv: pytest.fail("ran"))
    assert "give --data-dir" in said[0] and not ledger.folders["mnist"]["finished"]


@pytest.mark.integration
@pytest.mark.scenario  # four commands, a grid published then rerun: opt-in (CI runs it)
def test_a_published_grid_reruns_bit_identical_from_its_grid_file(tmp_path: Path) -> None:
    """The script, as a user runs it: one seed of a two-seed grid, resumed once finished;
    every rerun run ends bit-identical to the published one (same machine)."""
    results = _published(tmp_path, seeds=2)
    script = [sys.executable, str(ROOT / "scripts" / "rerun_results.py"), "--results",
              str(results), "--out", str(tmp_path / "rerun"), "--jobs", "1"]
    done = subprocess.run([*script, "--seeds", "1"], capture_output=True, text=True,
                          check=True)
    ledger = json.loads((tmp_path / "rerun" / LEDGER).read_text())
    assert ledger["tiny"]["finished"] and ledger["tiny"]["compared"] == {
        "identical": 2, "different": 0, "other_machine": 0, "other_machine_identical": 0,
        "unpublished": 0}
    assert ledger["tiny"]["cells"] == 2 and ledger["tiny"]["all_cells"] == 4
    assert "2 identical" in done.stdout
    again = subprocess.run([*script, "--seeds", "1"], capture_output=True, text=True,
                           check=True)
    assert "finished before" in again.stderr
    lines = summary(Ledger(tmp_path / "rerun" / LEDGER))
    assert lines[1].startswith("tiny") and lines[-1].startswith("all")
    shown = subprocess.run([*script, "--summary"], capture_output=True, text=True, check=True)
    assert "2 identical, 0 different" in shown.stdout


def test_a_rerun_into_the_published_folders_is_refused(tmp_path: Path) -> None:
    """--out the results folder itself: refused before anything is cleared or written."""
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    (results / "tiny" / "grid.toml").write_text(GRID.format(seeds=1), encoding="utf-8")
    with pytest.raises(ConfigError, match="holds the published tiny"):
        rerun(published_folders(results), results, seeds=None, cut=False, jobs=1,
              data_dir=None, progress=lambda _: None, run=lambda argv: pytest.fail("ran"))
    assert (results / "tiny" / "grid.toml").exists()


def test_the_published_rerun_report_shows_its_ledgers() -> None:
    """docs/results/rerun/report.md's tables are what its ledgers give, the full rerun's
    (rerun.json, every grid finished) and the one-seed sample's before it (sample.json):
    the figures docs/results.md quotes for machine time come from the repository."""
    folder = ROOT / "docs" / "results" / "rerun"
    report = (folder / "report.md").read_text(encoding="utf-8")
    for name in (LEDGER, "sample.json"):
        table = "\n".join(summary(Ledger(folder / name)))
        assert f"```\n{table}\n```" in report
    full = Ledger(folder / LEDGER).folders
    assert all(entry["finished"] and entry["seeds"] is None for entry in full.values())
    assert {f.name for f in published_folders(ROOT / "docs" / "results")} <= set(full)
