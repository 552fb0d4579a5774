"""``worst-case.png``: a grid file's worst cases (:mod:`ps.experiments.worstcase`) as a
heat map, one panel per table, each over the one set of ``worst_over`` values its title
names; the panels over one set side by side, one row of panels per set. In each square:
the mean over seeds of the per-seed worst, its standard deviation over seeds and the
value worst on most seeds. A square at chance (within ``CHANCE_BAND`` of k / classes) is
dotted, one below it crossed; one whose cell ran only part of the set says n/a, one not
run is blank."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from ps.experiments.figures import chance, run_caption
from ps.experiments.gridfile import ReportAxes
from ps.experiments.worstcase import NOT_APPLICABLE, Table, WorstCase
from ps.plots.style import pyplot, save

# A model that learned nothing (a constant class) scores k / classes on a balanced test
# set; the published ones lie within 0.003 of it, a model steered to wrong labels far below
CHANCE_BAND = 0.01
AT_CHANCE, BELOW_CHANCE = "at chance", "below chance"
HATCHES = {AT_CHANCE: "..", BELOW_CHANCE: "xx"}
CELL = (1.25, 0.62)  # inches per square: width, height
MARGIN = (2.6, 1.7)  # inches per panel for its labels and title


def chance_mark(mean: float, level: float) -> str | None:
    """``below chance`` under ``level`` - ``CHANCE_BAND``, ``at chance`` within it of
    ``level``, None above (and for a diverged, NaN, mean: its square says so)."""
    if mean < level - CHANCE_BAND:
        return BELOW_CHANCE
    return AT_CHANCE if abs(mean - level) <= CHANCE_BAND else None


def square_text(case: WorstCase | None) -> str:
    """``0.63\\n±0.04\\nalie``: the mean, its spread over seeds (none for one seed) and the
    value that gives it; ``n/a`` for a cell that ran part of the set."""
    if case is None:
        return NOT_APPLICABLE
    if math.isnan(case.mean):
        return f"NaN\n{case.where}"
    spread = f"\n±{case.std:.2f}" if case.seeds > 1 else ""
    return f"{case.mean:.2f}{spread}\n{case.where}"


def worst_case_heatmap(out: Path, tables: list[Table], axes: ReportAxes,
                       results: list[dict[str, Any]], metric: str, measure: str) -> Path:
    """Draw ``tables`` (of final ``metric``, ``measure``: ``test top1``...) into
    ``worst-case.png``."""
    plt = pyplot()
    from matplotlib.patches import Patch

    by_set: dict[tuple[str, ...], list[Table]] = {}
    for table in tables:
        by_set.setdefault(table.panel.over, []).append(table)
    width = max(len(row) * (CELL[0] * len(row[0].columns) + MARGIN[0])
                for row in by_set.values())
    heights = [CELL[1] * len(row[0].rows) + MARGIN[1] for row in by_set.values()]
    fig = plt.figure(figsize=(width + 1.5, sum(heights) + 1.2), layout="constrained")
    level = chance(results, metric)
    subfigures = fig.subfigures(len(by_set), 1, height_ratios=heights, squeeze=False)[:, 0]
    images = []
    for subfigure, row in zip(subfigures, by_set.values(), strict=True):
        panels = subfigure.subplots(1, len(row), squeeze=False)[0]
        images = [draw_table(ax, table, axes, level)
                  for ax, table in zip(panels, row, strict=True)]
    top = subfigures[0]
    bar = top.colorbar(images[0], ax=top.axes, label=f"worst final {measure}")
    bar.ax.axhline(level, color="white", linestyle=":", linewidth=1.5)
    marks = [Patch(facecolor="0.3", edgecolor="white", hatch=HATCHES[AT_CHANCE],
                   label=f"{AT_CHANCE}: {level:g} ± {CHANCE_BAND:g} (dotted line on the "
                         "colour bar)"),
             Patch(facecolor="0.3", edgecolor="white", hatch=HATCHES[BELOW_CHANCE],
                   label=f"{BELOW_CHANCE}: under {level - CHANCE_BAND:g}")]
    fig.legend(handles=marks, loc="outside lower center", ncol=2, handlelength=4,
               handleheight=2.5)
    fig.suptitle(textwrap.fill(
        f"{run_caption(results)}. Each square: per seed the lowest final {measure} over the "
        f"panel's values of {axes.worst_over} (its title), then the mean over seeds, ± the "
        f"std over seeds, and the value worst on most seeds; {NOT_APPLICABLE}: the cell ran "
        f"only part of the panel's set; blank: not run", 160), fontsize=9)
    return save(fig, out / "worst-case.png")


def draw_table(ax, table: Table, axes: ReportAxes, level: float):
    """One table's squares on ``ax`` (``level``: chance); the image (for the colour
    bar)."""
    values = np.array([[_mean(table.cells.get((r, c))) for c in table.columns]
                       for r in table.rows])
    cmap = pyplot().get_cmap("viridis").with_extremes(bad="0.93")
    image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap=cmap,
                      aspect=CELL[1] / CELL[0])
    for (i, j), v in np.ndenumerate(values):
        key = (table.rows[i], table.columns[j])
        if key not in table.cells:
            continue
        case = table.cells[key]
        mark = None if case is None else chance_mark(case.mean, level)
        if mark is not None:
            ax.add_patch(_hatch(i, j, HATCHES[mark]))
        box = None if mark is None else {"boxstyle": "round,pad=0.15", "linewidth": 0,
                                         "facecolor": (0.1, 0.1, 0.1, 0.85)}
        ax.text(j, i, square_text(case), ha="center", va="center", fontsize=7, bbox=box,
                color="black" if not v <= 0.6 else "white")
    ax.set_xticks(range(len(table.columns)), table.columns, rotation=35, ha="right")
    ax.set_yticks(range(len(table.rows)), table.rows)
    ax.grid(False)
    ax.set_xlabel(axes.columns)
    ax.set_ylabel(axes.rows)
    ax.set_title(textwrap.fill(table.panel.title(axes.worst_over), 44), fontsize=9)
    return image


def _hatch(i: int, j: int, hatch: str):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch=hatch,
                     edgecolor=(1, 1, 1, 0.55), linewidth=0)


def _mean(case: WorstCase | None) -> float:
    """A square's colour: the worst case's mean; NaN (blank) for n/a or not run."""
    return math.nan if case is None else case.mean

