"""A grid file's worst cases over ``[report]``'s ``worst_over`` axis (ByzFL's worst case
over the attacks), with one set of its values per table: every entry of a table is a
worst case over the same values, named in its title, so that a worst case over two
attacks is never shown beside one over eight as if alike.

The sets are the cells' own (the values of ``worst_over`` each (panel, row, column) ran).
A set's *home* panels (values of the other axes) are those where a cell ran exactly it;
its tables have the columns where a home panel ran all of it and every row a home panel
ran there, one table for every panel that ran all of it in one of those cells: momentum
0 run against ALIE and Mimic alone gives a table over those two, and momentum 0.9 a
table over the same two on the same rows and columns beside it; the cells that ran more
are taken over the set's values only. A cell that ran part of the set is *n/a*
(``None``), never a worst case over fewer values; one that did not run is absent.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ps.experiments.claims import TIES_RULE, Sample, ties, ties_text
from ps.experiments.filereport import axis_value, final, spread, spread_text
from ps.experiments.gridfile import ReportAxes

NOT_APPLICABLE = "n/a"  # ran part of its table's set
NOT_RUN = "-"

Runs = list[dict[str, Any]]


@dataclass
class WorstCase:
    """A row's worst case over a set of ``worst_over`` values at one column: per seed
    the lowest final over those values, then the mean and spread of those minima over
    seeds (a minimum of means would be biased up)."""

    mean: float  # NaN: a seed diverged
    std: float  # over seeds, of the per-seed minima
    seeds: int
    where: str  # the value of the worst_over axis that is the worst on most seeds
    runs: Runs  # its cells, one per seed (its curves)
    ties: list[str] | None = None  # values not ranked apart from it (None: one seed)
    lows: dict[Any, float] = field(default_factory=dict)  # seed -> its worst final

    def text(self) -> str:
        """``0.251 ± 0.025 (alie; ~ none)``, as the tables show it."""
        return (f"{spread_text(self.mean, self.std, self.seeds)} "
                f"({self.where}{ties_text(self.ties)})")


@dataclass(frozen=True)
class Panel:
    """What a table holds fixed: the values of the axes the ``[report]`` table does not
    name, and the values of ``worst_over`` that each of its entries is a worst case
    over (in the grid's order)."""

    fixed: tuple[tuple[str, str], ...]  # (axis, value)
    over: tuple[str, ...]

    def title(self, worst_over: str) -> str:
        """``worker-momentum = 0; worst over worker-attack: none, alie, mimic``."""
        over = f"worst over {worst_over}: {', '.join(self.over)}"
        return "; ".join([*(f"{a} = {v}" for a, v in self.fixed), over])


@dataclass
class Table:
    """A panel's rows x columns: a worst case, ``None`` (n/a: the cell ran part of the
    panel's set) or nothing (not run) in each."""

    panel: Panel
    rows: list[str]
    columns: list[str]
    cells: dict[tuple[str, str], WorstCase | None]


Cell = tuple[tuple[str, ...], str, str]  # the values of the other axes, row, column


def worst_cases(results: Runs, metric: str, axes: ReportAxes, others: tuple[str, ...]
                ) -> list[Table]:
    """The tables of the worst cases over ``axes.worst_over``, one set of its values
    each (see the module): per seed the lowest final ``metric`` over the set (a diverged
    one, NaN, the lowest), over the seeds every value ran; the value worst on most seeds
    (ties: the lowest mean) names it. The ``baseline`` value is in no set."""
    ran: dict[Cell, dict[str, Runs]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if axis_value(r, axes.worst_over) == axes.baseline:
            continue  # the reference, in no worst case
        cell = (tuple(axis_value(r, a) for a in others), axis_value(r, axes.rows),
                axis_value(r, axes.columns))
        ran[cell][axis_value(r, axes.worst_over)].append(r)
    values = list(dict.fromkeys(w for by_where in ran.values() for w in by_where))
    homes: dict[tuple[str, ...], set[tuple[str, ...]]] = defaultdict(set)
    for (panel, _, _), by_where in ran.items():
        homes[tuple(v for v in values if v in by_where)].add(panel)
    return [table for over, panels in homes.items()
            for table in _tables(ran, over, panels, others, metric)]


def _tables(ran: dict[Cell, dict[str, Runs]], over: tuple[str, ...],
            homes: set[tuple[str, ...]], others: tuple[str, ...], metric: str) -> list[Table]:
    """The tables over the set ``over`` (``homes``: the panels where a cell ran exactly
    it): its columns those where a home panel ran all of it, its rows every row a home
    panel ran there; one table per panel that ran all of it in one of those cells."""
    covering = [cell for cell, by_where in ran.items() if set(over) <= by_where.keys()]
    columns = list(dict.fromkeys(column for panel, _, column in covering if panel in homes))
    rows = list(dict.fromkeys(row for panel, row, column in ran
                              if panel in homes and column in columns))
    panels = dict.fromkeys(panel for panel, row, column in covering
                           if row in rows and column in columns)
    tables = []
    for panel in sorted(panels, key=list(dict.fromkeys(c[0] for c in ran)).index):
        cells: dict[tuple[str, str], WorstCase | None] = {}
        for row in rows:
            for column in columns:
                by_where = ran.get((panel, row, column))
                if by_where is not None:
                    cells[(row, column)] = (_worst_case({w: by_where[w] for w in over}, metric)
                                            if set(over) <= by_where.keys() else None)
        fixed = tuple(zip(others, panel, strict=True))
        tables.append(Table(Panel(fixed, over), rows, columns, cells))
    return tables


def _worst_case(by_where: dict[str, Runs], metric: str) -> WorstCase:
    """The worst case over ``by_where``'s values (each its runs, one per seed)."""
    per_seed = {w: {r.get("seed", i): final(r, metric) for i, r in enumerate(runs)}
                for w, runs in by_where.items()}  # (without seeds: by position)
    seeds = set.intersection(*(set(v) for v in per_seed.values()))
    by_seed = {s: min((v[s] for v in per_seed.values()), key=_low)
               for s in sorted(seeds, key=str)}
    lows = list(by_seed.values())
    worst_on = Counter(min(per_seed, key=lambda w: _low(per_seed[w][s])) for s in seeds)
    means = {w: statistics.fmean(map(_low, v.values())) for w, v in per_seed.items()}
    where = min(per_seed, key=lambda w: (-worst_on[w], means[w]))
    mean, std = spread(lows)
    values = {w: [per_seed[w][s] for s in sorted(seeds, key=str)] for w in per_seed}
    return WorstCase(mean, std, len(lows), where, by_where[where],
                     ties(values[where], {w: v for w, v in values.items() if w != where}),
                     by_seed)


def _low(value: float) -> float:
    """A diverged final (NaN) ranks below every other."""
    return -math.inf if math.isnan(value) else value


def worst_tables(tables: list[Table], axes: ReportAxes, measure: str) -> list[str]:
    """Markdown: each table under its title (its set of ``worst_over`` values), rows x
    columns, each entry the worst case with its seed spread and the value that gives
    it; ``measure``: ``test top1``..."""
    lines = ["", f"## Worst case over {axes.worst_over}: final {measure}", "",
             f"Each table is over one set of values of {axes.worst_over}, named in its "
             "title. Each entry: per seed the lowest final among those values, then the "
             "mean (± std) of those over seeds, and the value that is the worst on most "
             f"seeds; *{NOT_APPLICABLE}*: the cell ran only some of the set's values (no "
             f"worst case over fewer is shown); *{NOT_RUN}*: not run. {TIES_RULE}"]
    if axes.baseline is not None:
        lines[-1] += (f" {axes.worst_over} = {axes.baseline} is the baseline, in no worst "
                      "case: its runs are in the table of every cell.")
    for table in tables:
        lines += ["", f"### {table.panel.title(axes.worst_over)}", "",
                  f"| {axes.rows} \\ {axes.columns} | " + " | ".join(table.columns) + " |",
                  "|---|" + "---|" * len(table.columns)]
        for row in table.rows:
            entries = [_entry(table, row, column) for column in table.columns]
            lines.append(f"| {row} | " + " | ".join(entries) + " |")
    return lines


def _entry(table: Table, row: str, column: str) -> str:
    if (row, column) not in table.cells:
        return NOT_RUN
    case = table.cells[(row, column)]
    return NOT_APPLICABLE if case is None else case.text()


def at_round(results: Runs, round_: int) -> Runs:
    """Each run as if it ended at ``round_``: its evaluations up to it; a run without an
    evaluation at ``round_`` is left out."""
    cut = []
    for r in results:
        points = [p for p in r["points"] if p["round"] <= round_]
        if points and points[-1]["round"] == round_:
            cut.append({**r, "points": points})
    return cut


def round_tables(finals: list[Table], results: Runs, metric: str, axes: ReportAxes,
                 others: tuple[str, ...], measure: str) -> list[str]:
    """Markdown: for each of ``axes.at_rounds``, every worst case of the final tables
    (``finals``: :func:`worst_cases` of ``results``) at that round beside the final one,
    and the change paired by seed (has it settled?); a round no run was evaluated at is
    said in one line, an entry without a worst case there is marked."""
    lines: list[str] = []
    for at in axes.at_rounds:
        cut = at_round(results, at)
        lines += ["", f"## Worst case over {axes.worst_over} at round {at} and at the end: "
                  f"{measure}", ""]
        if not cut:
            lines.append(f"No run was evaluated at round {at} (evaluations every "
                         "`--eval-every` rounds and at the last): nothing to compare.")
            continue
        early = {t.panel: t for t in worst_cases(cut, metric, axes, others)}
        lines.append(f"The tables above, each entry at round {at} (every run cut there: the "
                     "same per-seed worst over the same values) → at the last round, both "
                     "over the seeds they share, then the change paired by seed: its mean "
                     "and 95 % interval. A worst case that has settled changes by an "
                     f"interval holding 0. *(no round {at})*: no worst case over the same "
                     "values there; the final one alone.")
        lines += paired_tables(finals, early, axes, f"no round {at}")
    return lines


def paired_tables(finals: list[Table], earlier: dict[Panel, Table], axes: ReportAxes,
                  missing: str) -> list[str]:
    """Markdown: each table of ``finals`` under its title, every entry beside the same
    panel's and cell's worst case in ``earlier`` and the change paired by seed; an entry
    without one there is marked ``(missing)``."""
    lines: list[str] = []
    for table in finals:
        before = earlier.get(table.panel)
        lines += ["", f"### {table.panel.title(axes.worst_over)}", "",
                  f"| {axes.rows} \\ {axes.columns} | " + " | ".join(table.columns)
                  + " |", "|---|" + "---|" * len(table.columns)]
        for row in table.rows:
            entries = [_change(None if before is None else before.cells.get((row, c)),
                               table, row, c, missing) for c in table.columns]
            lines.append(f"| {row} | " + " | ".join(entries) + " |")
    return lines


def _change(before: WorstCase | None, table: Table, row: str, column: str,
            missing: str) -> str:
    """``0.586 → 0.507, -0.079 [-0.301, +0.143]`` over the seeds both have (``(2 of 3
    seeds)`` when fewer than the final's); the final entry alone, marked ``(missing)``,
    without an earlier worst case."""
    after = table.cells.get((row, column))
    if after is None:
        return _entry(table, row, column)
    shared = sorted(set(after.lows) & set(before.lows), key=str) if before else []
    if before is None or not shared:
        return f"{after.text()} *({missing})*"
    early = {s: before.lows[s] for s in shared}
    late = {s: after.lows[s] for s in shared}
    change = Sample.of(_finite(late)) - Sample.of(_finite(early))
    fewer = f" ({len(shared)} of {len(after.lows)} seeds)" if len(shared) < len(after.lows) \
        else ""
    return (f"{_mean_text(early)} → {_mean_text(late)}, {change.difference_text()}{fewer}")


def _mean_text(lows: dict[Any, float]) -> str:
    """The mean of per-seed worsts, ``NaN`` if one diverged (as the tables write it)."""
    mean = statistics.fmean(lows.values())
    return "NaN" if math.isnan(mean) else f"{mean:.3f}"


def _finite(lows: dict[Any, float]) -> dict[Any, float]:
    """A diverged final (NaN) counts as 0, as in the ties."""
    return {s: 0.0 if math.isnan(v) else v for s, v in lows.items()}
