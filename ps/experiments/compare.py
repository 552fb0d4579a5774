"""Two finished grids' worst cases side by side, paired by seed: ``ps-experiment compare``.

Two grids with the same axes and the same ``[report]`` (rows, columns, ``worst_over``,
baseline) that differ in a setting they all share (a learning-rate schedule, a length)
have the same cells; each cell's worst case (per seed the lowest final over the same
values of ``worst_over``: ``worstcase.worst_cases``) in the first is set beside the
second's, over the seeds both ran, and the change is paired by seed with its 95 %
Student-t interval, as a report's ``at_rounds`` tables do within one grid. Either grid
may be read at an earlier round (``at_round``: every run cut there). Only the published
files are read (``results.jsonl[.gz]`` and ``grid.json``): nothing runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from ps.experiments.filereport import report_others
from ps.experiments.grid import evaluated_on
from ps.experiments.gridfile import GridFile, ReportAxes
from ps.experiments.rebuild import GRID_JSON, read_results
from ps.experiments.worstcase import at_round, paired_tables, worst_cases

Runs = list[dict[str, Any]]
# what of a [report] two grids must share to be compared (their at_rounds may differ)
SHARED_REPORT = ("rows", "columns", "worst_over", "baseline")


@dataclass(frozen=True)
class Side:
    """One grid of the comparison: its folder, its runs (cut at ``round_`` if given),
    what its ``grid.json`` says."""

    folder: Path
    round_: int | None
    runs: Runs
    grid: dict[str, Any]

    @property
    def when(self) -> str:
        return "its last round" if self.round_ is None else f"round {self.round_}"


def read_side(folder: Path, round_: int | None = None) -> Side:
    """``folder``'s published runs, cut at ``round_`` (None: as they ended);
    ``ConfigError`` without a grid file's report, or with no evaluation at ``round_``."""
    try:
        grid = json.loads((folder / GRID_JSON).read_text(encoding="utf-8"))
    except OSError:
        raise ConfigError(f"{folder}: no {GRID_JSON}: not a finished grid") from None
    if grid.get("grid") != "file" or not grid.get("report"):
        raise ConfigError(f"{folder}: not a grid file's results with a [report] (its "
                          "rows, columns and worst_over are what is compared)")
    runs = read_results(folder)
    if round_ is not None:
        runs = at_round(runs, round_)
        if not runs:
            raise ConfigError(f"{folder}: no run was evaluated at round {round_}")
    return Side(folder, round_, runs, grid)


def compare_lines(before: Side, after: Side) -> list[str]:
    """Markdown: ``after``'s worst-case tables, each entry beside ``before``'s worst case
    of the same cell and the change paired by seed; ``ConfigError`` naming what differs
    when the two grids do not have the same cells to compare."""
    report = after.grid["report"]
    for key in ("axes", "metric"):
        if before.grid[key] != after.grid[key]:
            raise ConfigError(f"the two grids differ in their {key}: "
                              f"{before.grid[key]} and {after.grid[key]}")
    differ = [k for k in SHARED_REPORT if before.grid["report"].get(k) != report.get(k)]
    if differ:
        raise ConfigError(f"the two grids' [report] differ in {', '.join(differ)}")
    axes = ReportAxes(**{k: report.get(k) for k in SHARED_REPORT})
    grid = GridFile(after.grid["name"], [], tuple(after.grid["axes"]), {}, axes)
    others = report_others(grid, after.runs)
    if report_others(grid, before.runs) != others:
        raise ConfigError("the two grids vary different axes apart from their [report]: "
                          "their cells do not pair")
    metric = after.grid["metric"]
    finals = worst_cases(after.runs, metric, axes, others)
    earlier = {t.panel: t for t in worst_cases(before.runs, metric, axes, others)}
    measure = f"{evaluated_on(after.runs)} {metric}"
    return [
        f"# Worst cases over {axes.worst_over}: {after.folder.name} beside "
        f"{before.folder.name}",
        "",
        f"* Before: `{before.folder}` at {before.when} (`{before.grid['command']}`)",
        f"* After: `{after.folder}` at {after.when} (`{after.grid['command']}`)",
        f"* Measure: {measure}",
        "",
        f"Each entry: the worst case over {axes.worst_over} of the cell before → after "
        "(per seed the lowest over the same values, then the mean over the seeds both "
        "ran), then the change paired by seed: its mean and 95 % interval; cells matched "
        f"by their values of every axis. *(not in {before.folder.name})*: no worst case "
        "of that cell before.",
        *paired_tables(finals, earlier, axes, f"not in {before.folder.name}"),
    ]
