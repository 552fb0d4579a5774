"""The report of a grid file (``ps-experiment run``): the final accuracy of every cell
(mean ± std over seeds) by the grid's axes and, with a ``[report]`` table, each row's
worst case over an axis (ByzFL's worst case over attacks) as a table, a heat map and
the accuracy curves of those worst cases."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ps.experiments.claims import TIES_RULE, ties, ties_text
from ps.experiments.grid import evaluated_on
from ps.experiments.gridfile import (
    DEFENCE,
    HETEROGENEITY,
    PARTITION_KEYS,
    GridFile,
    ReportAxes,
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


def _spread(values: list[float]) -> tuple[float, float]:
    """(mean, std) over seeds; NaN if a seed diverged; std 0 for one seed."""
    if any(math.isnan(v) for v in values):
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _spread_text(mean: float, std: float, seeds: int) -> str:
    if math.isnan(mean):
        return "NaN"
    return f"{mean:.3f}" if seeds == 1 else f"{mean:.3f} ± {std:.3f}"


@dataclass
class WorstCase:
    """A row's worst case over ``worst_over`` at one column (and one panel): per seed the
    lowest final over the values of ``worst_over``, then the mean and spread of those
    minima over seeds (a minimum of means would be biased up)."""

    mean: float  # NaN: a seed diverged
    std: float
    seeds: int
    where: str  # the value of the worst_over axis that is the worst on most seeds
    runs: list[dict[str, Any]]  # its cells, one per seed (its curves)
    ties: list[str] | None = None  # values not ranked apart from it (None: one seed)


def worst_cases(results: list[dict[str, Any]], metric: str, axes: ReportAxes,
                others: tuple[str, ...]
                ) -> dict[tuple[str, ...], dict[tuple[str, str], WorstCase]]:
    """panel (the values of ``others``) -> (row, column) -> the worst case over
    ``axes.worst_over``: per seed the lowest final ``metric`` over its values (a diverged
    one, NaN, the lowest), over the seeds every value ran; the value worst on most seeds
    (ties: the lowest mean) names it."""
    grouped: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        grouped[(tuple(axis_value(r, a) for a in others), axis_value(r, axes.rows),
                 axis_value(r, axes.columns), axis_value(r, axes.worst_over))].append(r)
    cells: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(dict)
    for (panel, row, column, where), runs in grouped.items():
        cells[(panel, row, column)][where] = runs
    out: dict[tuple[str, ...], dict[tuple[str, str], WorstCase]] = defaultdict(dict)
    for (panel, row, column), by_where in cells.items():
        out[panel][(row, column)] = _worst_case(by_where, metric)
    return dict(out)


def _worst_case(by_where: dict[str, list[dict[str, Any]]], metric: str) -> WorstCase:
    """The worst case over ``by_where``'s values (each its runs, one per seed)."""
    per_seed = {w: {r.get("seed", i): final(r, metric) for i, r in enumerate(runs)}
                for w, runs in by_where.items()}  # (without seeds: by position)
    seeds = set.intersection(*(set(v) for v in per_seed.values()))
    lows = [min((v[s] for v in per_seed.values()), key=_low) for s in sorted(seeds, key=str)]
    worst_on = Counter(min(per_seed, key=lambda w: _low(per_seed[w][s])) for s in seeds)
    means = {w: statistics.fmean(map(_low, v.values())) for w, v in per_seed.items()}
    where = min(per_seed, key=lambda w: (-worst_on[w], means[w]))
    mean, std = _spread(lows)
    values = {w: [per_seed[w][s] for s in sorted(seeds, key=str)] for w in per_seed}
    return WorstCase(mean, std, len(lows), where, by_where[where],
                     ties(values[where], {w: v for w, v in values.items() if w != where}))


def _low(value: float) -> float:
    """A diverged final (NaN) ranks below every other."""
    return -math.inf if math.isnan(value) else value


def report_others(grid: GridFile, results: list[dict[str, Any]]) -> tuple[str, ...]:
    """The axes that the ``[report]`` table does not name, and that vary apart from
    ``worst_over`` (``byzantine-workers`` set with each attack does not): one panel per
    combination of their values."""
    axes = grid.report
    if axes is None:  # no [report] table: no panels (its one caller asks only with one)
        return ()
    named = {axes.rows, axes.columns, axes.worst_over}
    if DEFENCE in named:
        named |= {"rule", "pre"}
    if HETEROGENEITY in named:
        named |= set(PARTITION_KEYS)
    worst = {axis_value(r, axes.worst_over) for r in results}
    return tuple(a for a in grid.axes if a not in named and len(
        {(axis_value(r, axes.worst_over), axis_value(r, a)) for r in results}) > len(worst))


def write_file_report(out: Path, results: list[dict[str, Any]], info: ReportInfo,
                      grid: GridFile) -> Path:
    """``report.md`` of a grid file: how it was made, the table of every cell, the worst
    cases with their figures (with ``[report]``), the verification."""
    lines = [*header(results, info), f"* Grid file: `{grid.name}`"]
    lines += _cell_table(results, info.metric, grid.axes)
    if grid.report is not None:
        from ps.experiments.figures import worst_case_curves, worst_case_heatmap

        others = report_others(grid, results)
        cases = worst_cases(results, info.metric, grid.report, others)
        lines += _worst_tables(cases, grid.report, others,
                               f"{evaluated_on(results)} {info.metric}")
        for path in (worst_case_heatmap(out, cases, grid.report, others, info.metric, results),
                     worst_case_curves(out, cases, grid.report, others, info.metric, results)):
            lines += ["", f"![{path.name}]({path.name})"]
    from ps.experiments.heteroclaims import hetero_claim_lines

    lines += hetero_claim_lines(results, info.metric)
    if info.verification is not None:
        lines += verification_lines(info.verification)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


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
        lines.append(f"| {shown} | {_spread_text(*_spread(finals), len(finals))} | "
                     f"{len(finals)} |")
    return lines


def _worst_tables(cases: dict[tuple[str, ...], dict[tuple[str, str], WorstCase]],
                  axes: ReportAxes, others: tuple[str, ...], measure: str) -> list[str]:
    """Per panel: rows x columns, each the worst case over ``worst_over``, with its
    seed spread and the value that gives it; ``measure``: ``test top1``..."""
    lines = ["", f"## Worst case over {axes.worst_over}: final {measure}", "",
             f"Each entry: per seed the lowest final among the values of "
             f"{axes.worst_over}, then the mean (± std) of those over seeds, and the value "
             f"that is the worst on most seeds. {TIES_RULE}"]
    for panel, table in cases.items():
        rows = list(dict.fromkeys(r for r, _ in table))
        columns = list(dict.fromkeys(c for _, c in table))
        title = ", ".join(f"{a} = {v}" for a, v in zip(others, panel, strict=True))
        lines += [""] + ([f"### {title}", ""] if title else [])
        lines += [f"| {axes.rows} \\ {axes.columns} | " + " | ".join(columns) + " |",
                  "|---|" + "---|" * len(columns)]
        for row in rows:
            cells = []
            for column in columns:
                case = table.get((row, column))
                cells.append("-" if case is None else
                             f"{_spread_text(case.mean, case.std, case.seeds)} "
                             f"({case.where}{ties_text(case.ties)})")
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines
