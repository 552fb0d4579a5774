"""``ps-experiment paper`` end to end on quick grids: its files (results, report with the
claims, figures), a grid killed midway resumes without recomputing a finished cell, cells
through real processes end bit-identical to the reference engine, a differing hash fails
the verification, and the CIFAR-10 recipe's plumbing."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from common.errors import EXIT_MISMATCH
from ps.experiments.cli import main
from ps.experiments.grid import GridSpec, paper_cells
from ps.experiments.runner import cell_path
from tests.unit.common.test_data import write_cifar

pytestmark = pytest.mark.integration

QUICK = ["--dataset", "synthetic", "--rounds", "4", "--seeds", "1", "--rules", "mean,marmed",
         "--scenarios", "none,bitflip", "--no-sweeps", "--eval-every", "2",
         "--workers", "4"]
PNG = b"\x89PNG\r\n\x1a\n"


def quick_cells(seeds: int = 1):
    return paper_cells(GridSpec(dataset="synthetic", rounds=4, seeds=seeds, num_workers=4,
                                rules=("mean", "marmed"), scenarios=("none", "bitflip"),
                                sweeps=False))


def _invoke(*args: str):
    result = CliRunner().invoke(main, ["paper", *args])
    return result


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


def test_a_quick_grid_writes_results_report_claims_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "grid"
    first = _invoke("--out", str(out), *QUICK)
    assert first.exit_code == 0, first.output
    assert "4 cells (4 distinct runs): 0 cached, 4 to run" in first.output
    points = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(points) == 4 * 3  # rounds 0, 2, 4 of each cell
    assert {p["round"] for p in points} == {0, 2, 4}
    report = (out / "report.md").read_text()
    assert "| mean | " in report and "| marmed | " in report and "bitflip" in report
    # the claims the quick grid can judge get a verdict; the others say they were not run
    assert "## The paper's claims" in report
    assert "| bitflip | only MarMed and MeaMed converge | not run |" in report
    assert "| gaussian | Mean fails | not run |" in report
    for name in ("accuracy-none.png", "accuracy-bitflip.png", "accuracy-grid.png"):
        assert _is_png(out / name), name
        assert f"![{name}]({name})" in report
    assert not (out / "q-sweep.png").exists()  # --no-sweeps
    # the report again from results.jsonl and grid.json alone, without the cache
    shutil.rmtree(out / "cells")
    (out / "report.md").unlink()
    again = CliRunner().invoke(main, ["report", str(out)])
    assert again.exit_code == 0, again.output
    assert (out / "report.md").read_text() == report


def test_a_grid_killed_midway_resumes_without_recomputing(tmp_path: Path) -> None:
    out = tmp_path / "grid"
    argv = [sys.executable, "-m", "ps.experiments.cli", "paper", "--out", str(out), *QUICK,
            "--seeds", "3", "--jobs", "1"]
    cells = quick_cells(seeds=3)
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while sum(cell_path(out, c).exists() for c in cells) < 2:
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no cell finished in 120 s"
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    finished = {c.key: cell_path(out, c).stat().st_mtime_ns for c in cells
                if cell_path(out, c).exists()}
    assert 2 <= len(finished) < len(cells)
    again = _invoke("--out", str(out), *QUICK, "--seeds", "3")
    assert again.exit_code == 0, again.output
    assert (f"12 cells (12 distinct runs): {len(finished)} cached, {12 - len(finished)} to "
            "run") in again.output
    assert {k: cell_path(out, c).stat().st_mtime_ns for c in cells
            for k in [c.key] if k in finished} == finished
    assert all(cell_path(out, c).exists() for c in cells)


def _children(pid: int) -> set[int]:
    """The processes ``pid`` started (Linux /proc)."""
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children |= {int(c) for c in (task / "children").read_text().split()}
    return children


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _long_grid(out: Path) -> subprocess.Popen:
    """ps-experiment computing two cells that take minutes, in its own session."""
    argv = [sys.executable, "-m", "ps.experiments.cli", "paper", "--out", str(out),
            "--dataset", "synthetic", "--rounds", "100000", "--seeds", "1", "--rules",
            "mean,marmed", "--scenarios", "none", "--no-sweeps", "--jobs", "2"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _cell_processes(process: subprocess.Popen) -> set[int]:
    """The pool's two cell processes, once both started."""
    deadline = time.monotonic() + 60
    while True:
        cells = {c for c in _children(process.pid)
                 if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()}
        if len(cells) >= 2:
            return cells
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the cells' processes never started"
        time.sleep(0.05)


def _all_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, "a cell's process outlived ps-experiment"
        time.sleep(0.05)


def test_a_stopped_grid_ends_its_cells_processes_at_once(tmp_path: Path) -> None:
    """SIGTERM to ps-experiment (not its process group) while two long cells run: it
    exits 130 within seconds, and none of its cell processes is left computing."""
    process = _long_grid(tmp_path / "grid")
    try:
        cells = _cell_processes(process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 130, process.stderr.read().decode()
        _all_gone(cells)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_grid_whose_cell_process_dies_ends_with_an_error(tmp_path: Path) -> None:
    """A cell's process killed (the OOM killer): ps-experiment ends with an error naming
    it, and ends the other cell's process, instead of waiting for a result forever."""
    process = _long_grid(tmp_path / "grid")
    try:
        cells = _cell_processes(process)
        os.kill(min(cells), signal.SIGKILL)
        code = process.wait(timeout=30)
        assert code not in (0, 130), code
        assert "terminated abruptly" in process.stderr.read().decode()
        _all_gone(cells)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_cells_through_the_cluster_match_the_reference_and_a_difference_fails(
        tmp_path: Path) -> None:
    out = tmp_path / "grid"
    assert _invoke("--out", str(out), *QUICK).exit_code == 0
    reference = {c.key: json.loads(cell_path(out, c).read_text()) for c in quick_cells()}
    # two cells through real ps-server, ps-worker and ps-proxy processes
    cluster = _invoke("--out", str(out), *QUICK, "--rules", "marmed", "--engine", "cluster")
    assert cluster.exit_code == 0, cluster.output
    assert "2 cells (2 distinct runs): 0 cached, 2 to run (1 at a time, cluster engine)" \
        in cluster.output
    marmed = [c for c in quick_cells() if c.rule == "marmed"]
    for cell in marmed:
        record = json.loads(cell_path(out, cell, "cluster").read_text())
        assert record["engine"] == "cluster"
        assert record["params_sha256"] == reference[cell.key]["params_sha256"]
        assert record["points"] == reference[cell.key]["points"]
        assert (out / "cluster" / cell.key / "server-0.jsonl").exists()
    assert "real ps-server, ps-worker and ps-proxy processes" in (out / "report.md").read_text()
    # --verify-sample: both marmed cells are chosen and cached; they agree
    verified = _invoke("--out", str(out), *QUICK, "--rules", "marmed", "--verify-sample", "2")
    assert verified.exit_code == 0, verified.output
    report = (out / "report.md").read_text()
    assert "2 cells run again through real processes (`--verify-sample`): 2 end with " \
        "bit-identical parameters" in report
    # a cluster result that differs from the reference: exit 5, named, and in the report
    tampered = cell_path(out, marmed[1], "cluster")
    record = json.loads(tampered.read_text())
    tampered.write_text(json.dumps({**record, "params_sha256": "0" * 64}))
    failed = _invoke("--out", str(out), *QUICK, "--rules", "marmed", "--verify-sample", "2")
    assert failed.exit_code == EXIT_MISMATCH, failed.output
    assert "| **no** |" in (out / "report.md").read_text()


def test_the_cifar10_recipe_runs_the_cnn_with_top3_on_a_tiny_synthetic_set(
        tmp_path: Path) -> None:
    data = tmp_path / "cifar"
    # 400 training images: 133 per worker, at least one batch of the recipe's 128
    write_cifar(data / "cifar-10-batches-py", per_batch=80)
    out = tmp_path / "grid"
    result = _invoke("--out", str(out), "--dataset", "cifar10", "--data-dir", str(data),
                     "--rounds", "2", "--seeds", "1", "--rules", "mean", "--scenarios",
                     "none", "--no-sweeps", "--eval-every", "1", "--workers", "3")
    assert result.exit_code == 0, result.output
    (record,) = [json.loads(p.read_text()) for p in (out / "cells").glob("*.json")]
    assert [p["round"] for p in record["points"]] == [0, 1, 2]
    cell = paper_cells(GridSpec.for_dataset("cifar10", rounds=2, seeds=1, num_workers=3,
                                            rules=("mean",), scenarios=("none",),
                                            sweeps=False))[0]
    assert record["key"] == cell.key
    assert cell.run["model"] == "cnn" and cell.run["lr"] == 5e-4
    assert cell.run["batch_size"] == 128
    report = (out / "report.md").read_text()
    assert "metric: top3" in report and "## Final test top3" in report
    assert _is_png(out / "accuracy-none.png")


MODERN = ["--dataset", "synthetic", "--rounds", "4", "--seeds", "1", "--workers", "7",
          "--defences", "mean,nnm+trimmed-mean", "--attacks", "none,inf",
          "--momenta", "0,0.9", "--eval-every", "2", "--jobs", "1"]


def test_the_modern_grid_tables_defences_by_attack_per_momentum(tmp_path: Path) -> None:
    """Two defences x (no attack, Inf by 2 of 7 workers) x two momenta: one table per
    momentum with each defence's worst case; Mean is wrecked by Inf where NNM + trimmed
    mean keeps its accuracy; a second invocation computes nothing; a defence with an
    unknown pre-aggregation is refused before any run."""
    out = tmp_path / "modern"
    first = CliRunner().invoke(main, ["modern", "--out", str(out), *MODERN])
    assert first.exit_code == 0, first.output
    assert "8 cells (8 distinct runs): 0 cached, 8 to run" in first.output
    report = (out / "report.md").read_text()
    assert "### Worker momentum 0: final test top1" in report
    assert "### Worker momentum 0.9: final test top1" in report
    points = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    final = {(p["worker_momentum"], p["defence"], p["scenario"]): p["top1"]
             for p in points if p["round"] == 4}
    loss = {(p["worker_momentum"], p["defence"], p["scenario"]): p["loss"]
            for p in points if p["round"] == 4}
    assert len(final) == 8
    for beta in (0.0, 0.9):
        assert math.isnan(loss[(beta, "mean", "inf")])  # the model is NaN: Mean averaged inf
        assert math.isfinite(loss[(beta, "nnm+trimmed-mean", "inf")])
        robust = final[(beta, "nnm+trimmed-mean", "inf")]
        assert f"| {robust:.3f} ({'inf'}) |" in report
        assert abs(robust - final[(beta, "nnm+trimmed-mean", "none")]) < 0.03
    # momentum changes what the workers push, so the runs differ
    assert final[(0.0, "mean", "none")] != final[(0.9, "mean", "none")]
    assert _is_png(out / "modern-grid.png") and "![modern-grid.png](modern-grid.png)" in report
    again = CliRunner().invoke(main, ["modern", "--out", str(out), *MODERN])
    assert again.exit_code == 0 and "8 cached, 0 to run" in again.output
    bad = CliRunner().invoke(main, ["modern", "--out", str(tmp_path / "bad"), *MODERN,
                                    "--defences", "mean,foo+krum"])
    assert bad.exit_code == 2 and "unknown pre-aggregation foo" in bad.output
    assert not (tmp_path / "bad" / "cells").exists()


TINY_GRID = """dataset = "synthetic"
workers = 5
rounds = 4
eval-every = 2
q = 1
rule = ["mean", "krum"]
worker-attack = ["none", "inf"]
byzantine-workers = [[], [0]]
worker-momentum = [0.0, 0.9]

[[exclude]]
worker-attack = "none"
byzantine-workers = [0]

[[exclude]]
worker-attack = "inf"
byzantine-workers = []

[[only]]
worker-momentum = 0.0

[report]
rows = "rule"
columns = "worker-momentum"
worst_over = "worker-attack"
"""


def test_a_grid_file_runs_its_cells_then_hits_the_cache_of_the_built_in_grids(
        tmp_path: Path) -> None:
    """Four cells of a file (two rules x no attack/Inf, momentum 0): the table, the worst
    case (Mean's under Inf) with its figures; run again, all cached; and the paper grid's
    cells with the same settings read the file grid's cache."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_GRID)
    out = tmp_path / "grid"
    first = CliRunner().invoke(main, ["run", str(path), "--out", str(out), "--jobs", "1"])
    assert first.exit_code == 0, first.output
    assert "4 cells (4 distinct runs): 0 cached, 4 to run" in first.output
    points = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(points) == 4 * 3
    assert {p["axes"]["worker-attack"] for p in points} == {"none", "inf"}
    report = (out / "report.md").read_text()
    assert "| rule | worker-attack | byzantine-workers | worker-momentum | top1 | seeds |" \
        in report
    assert "## Worst case over worker-attack" in report
    assert "| mean | 0.100 (inf) |" in report
    for name in ("worst-case.png", "worst-curves.png"):
        assert _is_png(out / name) and f"![{name}]({name})" in report
    again = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert again.exit_code == 0 and "4 cached, 0 to run" in again.output
    paper = _invoke("--out", str(out), "--dataset", "synthetic", "--workers", "5",
                    "--rounds", "4", "--seeds", "1", "--rules", "mean,krum", "--scenarios",
                    "none", "--no-sweeps", "--eval-every", "2")
    assert paper.exit_code == 0, paper.output
    # Krum's q = 1 there as in the file: its cell is the file's; Mean's q = 4 is not
    assert "2 cells (2 distinct runs): 1 cached, 1 to run" in paper.output
