"""The grid's figures, in the paper's layout (Xie, Koyejo, Gupta 2018, Fig. 1-6): per
scenario, test accuracy against rounds with one line per rule (the mean over seeds, a
band from the lowest to the highest seed) beside a zoom on the rounds where the
surviving rules converge; the q sweep and the batch-size sweep as their own figures.

Every figure is drawn from ``results`` (the records ``runner.run_cells`` returns, or
``results.jsonl`` regrouped), so a grid's figures can be redrawn without a run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ps.experiments.grid import SCENARIOS
from ps.plots.style import pyplot, rule_colour, save

SCENARIO_TITLES = {
    "none": "no attack",
    "gaussian": "Gaussian (6 of 20 workers, sd 200)",
    "omniscient": "omniscient (6 of 20 workers, -1e20 × sum)",
    "bitflip": "bit-flip (first 1000 coordinates, 1 of 20 values)",
    "gambler": "gambler (20 servers, one attacked, p = 0.05 %)",
}
SHORT_TITLES = {"none": "no attack", "gaussian": "Gaussian", "omniscient": "omniscient",
                "bitflip": "bit-flip", "gambler": "gambler"}
METRIC_LABELS = {"top1": "test top-1 accuracy", "top3": "test top-3 accuracy"}
ZOOM_FROM = 0.4  # the zoom shows the rounds after this fraction of the run


def curves(results: Iterable[dict[str, Any]], metric: str
           ) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, values[seed, point]) of runs evaluated at the same rounds."""
    runs = list(results)
    rounds = np.array([p["round"] for p in runs[0]["points"]])
    values = np.array([[_finite(p[metric]) for p in r["points"]] for r in runs])
    return rounds, values


def _finite(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else np.nan


def _by(results: Iterable[dict[str, Any]], *keys: str) -> dict[tuple, list[dict[str, Any]]]:
    grouped: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        grouped[tuple(r[k] for k in keys)].append(r)
    return grouped


def _plot_rule(ax, rounds: np.ndarray, values: np.ndarray, label: str, colour: str) -> None:
    """The mean over seeds, and the band between the lowest and the highest seed."""
    ax.plot(rounds, np.nanmean(values, axis=0), color=colour, label=label, linewidth=1.6)
    if len(values) > 1:
        ax.fill_between(rounds, np.nanmin(values, axis=0), np.nanmax(values, axis=0),
                        color=colour, alpha=0.18, linewidth=0)


def _zoom_limits(finals: list[float]) -> tuple[float, float]:
    """A y range around the best final values (the converging rules)."""
    best = max(finals)
    return max(0.0, best - 0.12), min(1.0, best + 0.03)


def draw_scenario(ax_full, ax_zoom, results: list[dict[str, Any]], scenario: str,
                  metric: str, rules: list[str], titles: dict[str, str] = SCENARIO_TITLES,
                  ) -> None:
    """One scenario: every rule's curve, and the zoom on the late rounds."""
    grouped = _by((r for r in results if r["scenario"] == scenario), "rule")
    finals = []
    for rule in rules:
        if (rule,) not in grouped:
            continue
        rounds, values = curves(grouped[(rule,)], metric)
        for ax in (ax_full, ax_zoom):
            if ax is not None:
                _plot_rule(ax, rounds, values, rule, rule_colour(rule))
        final = np.nanmean(values[:, -1])
        if math.isfinite(final):
            finals.append(float(final))
    ax_full.set_title(titles.get(scenario, scenario))
    ax_full.set_xlabel("round")
    ax_full.set_ylabel(METRIC_LABELS[metric])
    ax_full.set_ylim(0, 1)
    if ax_zoom is not None and finals:
        last = max(r["rounds"] for r in results)
        ax_zoom.set_xlim(ZOOM_FROM * last, last)
        ax_zoom.set_ylim(*_zoom_limits(finals))
        ax_zoom.set_title("zoom: late rounds")
        ax_zoom.set_xlabel("round")


def grid_figures(out: Path, results: list[dict[str, Any]], metric: str) -> list[Path]:
    """``accuracy-<scenario>.png`` (full and zoom) and ``accuracy-grid.png`` (every
    scenario side by side) for the main grid."""
    plt = pyplot()
    paper = [r for r in results if r["figure"] == "paper"]
    scenarios = [s for s in SCENARIOS if any(r["scenario"] == s for r in paper)]
    rules = list(dict.fromkeys(r["rule"] for r in paper))
    paths = []
    for scenario in scenarios:
        fig, (full, zoom) = plt.subplots(1, 2, figsize=(11, 4))
        draw_scenario(full, zoom, paper, scenario, metric, rules)
        full.legend(loc="lower right", ncol=2)
        fig.suptitle(_caption(paper, metric), fontsize=9)
        paths.append(save(fig, out / f"accuracy-{scenario}.png"))
    if scenarios:
        fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 4),
                                 squeeze=False)
        for ax, scenario in zip(axes[0], scenarios, strict=True):
            draw_scenario(ax, None, paper, scenario, metric, rules, SHORT_TITLES)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(labels),
                   bbox_to_anchor=(0.5, -0.06))
        fig.suptitle(_caption(paper, metric), fontsize=10)
        paths.append(save(fig, out / "accuracy-grid.png"))
    return paths


def _caption(results: list[dict[str, Any]], metric: str) -> str:
    datasets = ", ".join(sorted({r["dataset"] for r in results}))
    seeds = len({r["seed"] for r in results})
    return (f"{datasets}; n = 20; lines: mean over {seeds} seed(s), band: lowest to highest "
            f"seed; {METRIC_LABELS[metric]}")


def q_sweep_figure(out: Path, results: list[dict[str, Any]], metric: str) -> Path | None:
    """``q-sweep.png``: final accuracy against q under bit-flip, one line per rule."""
    sweep = [r for r in results if r["figure"] == "q-sweep"]
    if not sweep:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for (rule,), runs in _by(sweep, "rule").items():
        points = sorted(_by(runs, "q").items())
        qs = [q for (q,), _ in points]
        finals = [[_finite(r["points"][-1][metric]) for r in group] for _, group in points]
        ax.errorbar(qs, [np.nanmean(f) for f in finals], yerr=[np.nanstd(f) for f in finals],
                    marker="o", capsize=3, color=rule_colour(rule), label=rule)
    ax.set_title("q sweep under bit-flip: final accuracy")
    ax.set_xlabel("q (Byzantine values assumed per coordinate)")
    ax.set_ylabel(f"final {METRIC_LABELS[metric]}")
    ax.set_ylim(0, 1)
    ax.legend()
    return save(fig, out / "q-sweep.png")


def batch_sweep_figure(out: Path, results: list[dict[str, Any]], metric: str
                       ) -> Path | None:
    """``batch-sweep.png``: accuracy against rounds per batch size (Mean, no attack, lr
    scaled with the batch), and the final accuracy against the batch size."""
    sweep = [r for r in results if r["figure"] == "batch-sweep"]
    if not sweep:
        return None
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    groups = sorted(_by(sweep, "batch_size").items())
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(groups)))
    for ((batch,), runs), colour in zip(groups, colours, strict=True):
        rounds, values = curves(runs, metric)
        _plot_rule(left, rounds, values, f"batch {batch}", colour)
    left.set_title("Mean without attack, lr = base lr × batch / base batch")
    left.set_xlabel("round")
    left.set_ylabel(METRIC_LABELS[metric])
    left.set_ylim(0, 1)
    left.legend(loc="lower right")
    batches = [b for (b,), _ in groups]
    finals = [[_finite(r["points"][-1][metric]) for r in runs] for _, runs in groups]
    right.errorbar(batches, [np.nanmean(f) for f in finals],
                   yerr=[np.nanstd(f) for f in finals], marker="o", capsize=3,
                   color=rule_colour("mean"))
    right.set_xscale("log", base=2)
    right.set_title("final accuracy against batch size")
    right.set_xlabel("batch size")
    right.set_ylabel(f"final {METRIC_LABELS[metric]}")
    return save(fig, out / "batch-sweep.png")


def draw_all(out: Path, results: list[dict[str, Any]], metric: str) -> list[Path]:
    """Every figure the results support."""
    paths = grid_figures(out, results, metric)
    paths += [p for p in (q_sweep_figure(out, results, metric),
                          batch_sweep_figure(out, results, metric)) if p is not None]
    return paths


def _file_caption(results: list[dict[str, Any]], metric: str, axes) -> str:
    """How a grid file's worst-case figure was made, from its results."""
    datasets = ", ".join(sorted({r["dataset"] for r in results}))
    seeds = len({r["seed"] for r in results})
    return (f"{datasets}; {seeds} seed(s); worst case over {axes.worst_over} of the mean "
            f"final {METRIC_LABELS[metric]} over seeds")


def worst_case_heatmap(out: Path, cases: dict, axes, others: tuple[str, ...], metric: str,
                       results: list[dict[str, Any]]) -> Path:
    """``worst-case.png``: rows x columns of a grid file's ``[report]``, each square the
    worst case over ``worst_over`` (ByzFL's heat map), one panel per value of the other
    axes; the value and what gives it written in each square."""
    plt = pyplot()
    panels = list(cases.items())
    rows = list(dict.fromkeys(r for _, table in panels for r, _ in table))
    columns = list(dict.fromkeys(c for _, table in panels for _, c in table))
    fig, grid = plt.subplots(1, len(panels), squeeze=False, constrained_layout=True,
                             figsize=(1.3 * len(columns) * len(panels) + 2.8,
                                      0.55 * len(rows) + 2.0))
    image = None
    for ax, (panel, table) in zip(grid[0], panels, strict=True):
        values = np.array([[table[(r, c)].mean if (r, c) in table else np.nan
                            for c in columns] for r in rows])
        image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            case = table.get((rows[i], columns[j]))
            text = "-" if case is None else (
                "NaN" if not np.isfinite(v) else f"{v:.2f}") + f"\n{case.where}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="black" if v > 0.6 else "white")
        ax.set_xticks(range(len(columns)), columns, rotation=35, ha="right")
        ax.set_yticks(range(len(rows)), rows)
        ax.grid(False)
        ax.set_xlabel(axes.columns)
        ax.set_ylabel(axes.rows)
        ax.set_title(", ".join(f"{a} = {v}" for a, v in zip(others, panel, strict=True)))
    fig.colorbar(image, ax=grid[0].tolist(), label=f"worst final {METRIC_LABELS[metric]}")
    fig.suptitle(_file_caption(results, metric, axes), fontsize=9)
    return save(fig, out / "worst-case.png")


MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p")


def worst_case_curves(out: Path, cases: dict, axes, others: tuple[str, ...], metric: str,
                      results: list[dict[str, Any]]) -> Path:
    """``worst-curves.png``: accuracy against rounds of each row at its worst case, one
    panel per column (and value of the other axes); the band spans the seeds."""
    plt = pyplot()
    panels = [(panel, column, {r: case for (r, c), case in table.items() if c == column})
              for panel, table in cases.items()
              for column in dict.fromkeys(c for _, c in table)]
    rows = list(dict.fromkeys(r for _, _, lines in panels for r in lines))
    fig, grid = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 4), squeeze=False)
    for ax, (panel, column, lines) in zip(grid[0], panels, strict=True):
        for i, row in enumerate(rows):
            if row not in lines:
                continue
            rounds, values = curves(lines[row].runs, metric)
            _plot_rule(ax, rounds, values, row, rule_colour(row))
            ax.lines[-1].set_marker(MARKERS[i % len(MARKERS)])
            ax.lines[-1].set_markevery(max(1, len(rounds) // 6))
        title = ", ".join(f"{a} = {v}" for a, v in
                          [*zip(others, panel, strict=True), (axes.columns, column)])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(METRIC_LABELS[metric])
        ax.set_ylim(0, 1)
    handles, labels = grid[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6),
               bbox_to_anchor=(0.5, -0.08))
    fig.suptitle(_file_caption(results, metric, axes) + f"; lines: {axes.rows}", fontsize=9)
    return save(fig, out / "worst-curves.png")
