"""The report of a grid file (``ps-experiment run``): the final accuracy of every cell
(mean ± std over seeds) by the grid's axes and, with a ``[report]`` table, each row's
worst case over an axis (ByzFL's worst case over attacks, :mod:`ps.experiments.worstcase`)
as tables, a heat map and the accuracy curves of those worst cases; and how many cells'
curves have flattened by the last round (:mod:`ps.experiments.flatness`)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ps.experiments.flatness import flatness_lines
from ps.experiments.grid import evaluated_on
from ps.experiments.gridfile import (
    DEFENCE,
    HETEROGENEITY,
    PARTITION_KEYS,
    GridFile,
    defence_keys,
    value_text,
)
from ps.experiments.report import ReportInfo, header, verification_lines

PARAMETER = {"dirichlet": ("alpha", "α"), "gamma": ("gamma", "γ")}  # a partition's own


def axis_value(result: dict[str, Any], axis: str) -> str:
    """A result's value on ``axis`` (a grid key, ``defence`` or ``heterogeneity``), as
    text."""
    if axis == DEFENCE:
        return result["defence"]
    if axis == HETEROGENEITY:
        return heterogeneity(result["axes"])
    return value_text(_hashable(result["axes"][axis]))


def heterogeneity(axes: dict[str, Any]) -> str:
    """The partition of a cell's ``axes``, with its own parameter where that is an axis
    too: ``iid``, ``dirichlet α=0.1``, ``gamma γ=0.5``, ``extreme``."""
    partition = axes["partition"]
    key, symbol = PARAMETER.get(partition, ("", ""))
    return f"{partition} {symbol}={axes[key]:g}" if key in axes else partition


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def final(result: dict[str, Any], metric: str) -> float:
    """The last evaluation's ``metric``; NaN if it is not finite (the model diverged)."""
    value = result["points"][-1][metric]
    return float(value) if value is not None and math.isfinite(value) else math.nan


def spread(values: list[float]) -> tuple[float, float]:
    """(mean, std) over seeds; NaN if a seed diverged; std 0 for one seed."""
    if any(math.isnan(v) for v in values):
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def spread_text(mean: float, std: float, seeds: int) -> str:
    if math.isnan(mean):
        return "NaN"
    return f"{mean:.3f}" if seeds == 1 else f"{mean:.3f} ± {std:.3f}"


def report_others(grid: GridFile, results: list[dict[str, Any]]) -> tuple[str, ...]:
    """The axes that the ``[report]`` table does not name, and that vary apart from
    ``worst_over`` (``byzantine-workers`` set with each attack does not): one panel per
    combination of their values."""
    axes = grid.report
    if axes is None:  # no [report] table: no panels
        return ()
    named = {axes.rows, axes.columns, axes.worst_over}
    if DEFENCE in named:
        named |= set(defence_keys())
    if HETEROGENEITY in named:
        named |= set(PARTITION_KEYS)
    worst = {axis_value(r, axes.worst_over) for r in results}
    return tuple(a for a in grid.axes if a not in named and len(
        {(axis_value(r, axes.worst_over), axis_value(r, a)) for r in results}) > len(worst))


def write_file_report(out: Path, results: list[dict[str, Any]], info: ReportInfo,
                      grid: GridFile) -> Path:
    """``report.md`` of a grid file: how it was made, the table of every cell, the worst
    cases with their figures and at earlier rounds (with ``[report]``), how many curves
    have flattened, the verification."""
    measure = f"{evaluated_on(results)} {info.metric}"
    lines = [*header(results, info), f"* Grid file: `{grid.name}`"]
    lines += _cell_table(results, info.metric, grid.axes)
    others = report_others(grid, results)
    if grid.report is not None:
        from ps.experiments.figures import worst_case_curves
        from ps.experiments.heatmap import worst_case_heatmap
        from ps.experiments.worstcase import round_tables, worst_cases, worst_tables

        tables = worst_cases(results, info.metric, grid.report, others)
        lines += worst_tables(tables, grid.report, measure)
        for path in (
                worst_case_heatmap(out, tables, grid.report, results, info.metric, measure),
                worst_case_curves(out, tables, grid.report, info.metric, results)):
            lines += ["", f"![{path.name}]({path.name})"]
        lines += round_tables(tables, results, info.metric, grid.report, others, measure)
    if "partition" in grid.axes:
        axes, by = _flatness_axes(grid, others)
        lines += flatness_lines(_cells(results, axes), axes, by, info.metric, measure)
    from ps.experiments.heteroclaims import hetero_claim_lines

    lines += hetero_claim_lines(results, info.metric)
    if info.verification is not None:
        lines += verification_lines(info.verification)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _flatness_axes(grid: GridFile, others: tuple[str, ...]) -> tuple[tuple[str, ...], int]:
    """The axes that name a cell in the flatness table, and how many of them count the
    cells: the split and the ``[report]``'s panels (its columns and other axes), then its
    rows and ``worst_over``; without ``[report]``, the split, then the other axes."""
    if grid.report is None:
        rest = tuple(a for a in grid.axes if a not in PARTITION_KEYS)
        return (HETEROGENEITY, *rest), 1
    report = grid.report
    return (report.columns, *others, report.rows, report.worst_over), len(others) + 1


def _cells(results: list[dict[str, Any]], axes: tuple[str, ...]
           ) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """The runs of each cell (one per seed), by its values on ``axes``."""
    cells: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        cells[tuple(axis_value(r, a) for a in axes)].append(r)
    return cells


def _cell_table(results: list[dict[str, Any]], metric: str, axes: tuple[str, ...]
                ) -> list[str]:
    """One row per combination of the axes: the final ``metric`` over its seeds."""
    grouped: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for r in results:
        grouped[tuple(axis_value(r, a) for a in axes)].append(final(r, metric))
    names = list(axes) or ["cell"]
    lines = ["", f"## Final {evaluated_on(results)} {metric} (mean ± std over seeds)", "",
             "| " + " | ".join(names) + f" | {metric} | seeds |",
             "|" + "---|" * (len(names) + 2)]
    for values, finals in grouped.items():
        shown = " | ".join(values) if values else "all"
        lines.append(f"| {shown} | {spread_text(*spread(finals), len(finals))} | "
                     f"{len(finals)} |")
    return lines
