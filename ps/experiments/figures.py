"""The grid's figures, in the paper's layout (Xie, Koyejo, Gupta 2018, Fig. 1-6): per
scenario, test accuracy against rounds with one line per rule (the mean over seeds, a
band from the lowest to the highest seed) beside a zoom on the rounds where the
surviving rules converge (a second row where the scenarios stand side by side); the q
sweep and the batch-size sweep as their own figures. Every accuracy axis has a chance line
(k / classes for top-k, the classes from the dataset's spec), every line a marker of its
rule (``ps.plots.style.line_style``), and every caption and title is computed from the
results (dataset, n, f, S, rounds, seeds).

Every figure is drawn from ``results`` (the records ``runner.run_cells`` returns, or
``results.jsonl`` regrouped), so a grid's figures can be redrawn without a run.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.learn.data import dataset_shape
from ps.experiments.grid import SCENARIOS, evaluated_on
from ps.plots.style import line_style, pyplot, save

if TYPE_CHECKING:
    from ps.experiments.worstcase import Table

SHORT_TITLES = {"none": "no attack", "gaussian": "Gaussian", "omniscient": "omniscient",
                "bitflip": "bit-flip", "gambler": "gambler"}
METRIC_NAMES = {"top1": "top-1 accuracy", "top3": "top-3 accuracy"}
TOP_K = {"top1": 1, "top3": 3}
ZOOM_FROM = 0.4  # the zoom shows the rounds after this fraction of the run
FAILED_ABOVE_CHANCE = 0.1  # a final this close to chance failed (claims.FAIL_MARGIN)
BASELINE_LABEL = "mean, no attack"
MARKS = 6  # markers per line
PANELS_PER_ROW = 4  # of the worst-case curves


def _values(results: Iterable[dict[str, Any]], key: str) -> str:
    """The distinct values of ``key`` over ``results``, as text (``?`` if none has it)."""
    values = sorted({r[key] for r in results if key in r})
    return ", ".join(map(str, values)) or "?"


def scenario_title(scenario: str, runs: list[dict[str, Any]], short: bool = False) -> str:
    """A scenario's title, with the n, f and S of its ``runs``."""
    if short:
        return SHORT_TITLES.get(scenario, scenario)
    n, f = _values(runs, "num_workers"), _values(runs, "num_byzantine")
    return {"none": "no attack",
            "gaussian": f"Gaussian ({f} of {n} workers, sd 200)",
            "omniscient": f"omniscient ({f} of {n} workers, -1e20 × sum)",
            "bitflip": f"bit-flip (first 1000 coordinates, 1 of {n} values)",
            "gambler": f"gambler ({_values(runs, 'num_shards')} servers, one attacked, "
                       "p = 0.05 %)"}.get(scenario, scenario)


def metric_label(metric: str, results: Iterable[dict[str, Any]]) -> str:
    """``test top-1 accuracy``; ``validation top-1 accuracy`` for runs under
    ``--validation``."""
    return f"{evaluated_on(results)} {METRIC_NAMES[metric]}"


def chance(results: Iterable[dict[str, Any]], metric: str) -> float:
    """The accuracy of a random guess: k / classes for top-k (the lowest over the
    results' datasets)."""
    classes = max(dataset_shape(d)[1] for d in {r["dataset"] for r in results})
    return min(1.0, TOP_K[metric] / classes)


def _chance_line(ax, level: float) -> None:
    ax.axhline(level, color="0.35", linestyle=(0, (1, 2)), linewidth=1.0,
               label=f"chance ({level:.2f})")


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


def _plot_rule(ax, rounds: np.ndarray, values: np.ndarray, label: str,
               style: dict[str, str]) -> None:
    """The mean over seeds (``style``: its colour, marker, line style), and the band
    between the lowest and the highest seed."""
    ax.plot(rounds, np.nanmean(values, axis=0), label=label, linewidth=1.6, markersize=4,
            markevery=max(1, len(rounds) // MARKS), **style)
    if len(values) > 1:
        ax.fill_between(rounds, np.nanmin(values, axis=0), np.nanmax(values, axis=0),
                        color=style["color"], alpha=0.18, linewidth=0)


def _zoom_limits(finals: list[float], floor: float) -> tuple[float, float]:
    """A y range holding every final value above ``floor`` (the rules that learn; those
    that fail lie at chance, in the full panel), at least 0.12 tall."""
    best = max(finals)
    learned = [f for f in finals if f > floor] or [best]
    low = min(min(learned) - 0.02, best - 0.12)
    return max(0.0, low), min(1.0, best + 0.03)


def _zoom(ax, last: int, finals: list[float], floor: float) -> None:
    """Limit ``ax`` to the late rounds and to the final values of the rules that learn."""
    ax.set_xlim(ZOOM_FROM * last, last)
    ax.set_ylim(*_zoom_limits(finals, floor))


def draw_scenario(ax_full, ax_zoom, results: list[dict[str, Any]], scenario: str,
                  metric: str, rules: list[str], short: bool = False) -> None:
    """One scenario: every rule's curve, the chance line, and the zoom on the late
    rounds."""
    runs = [r for r in results if r["scenario"] == scenario]
    grouped = _by(runs, "rule")
    finals = []
    baseline = [r for r in results if r["scenario"] == "none" and r["rule"] == "mean"]
    if scenario != "none" and baseline:  # the paper's reference: Mean without attack
        rounds, values = curves(baseline, metric)
        for ax in (ax_full, ax_zoom):
            if ax is not None:
                ax.plot(rounds, np.nanmean(values, axis=0), color="0.45", linestyle="--",
                        linewidth=1.2, label=BASELINE_LABEL)
    for rule in rules:
        if (rule,) not in grouped:
            continue
        rounds, values = curves(grouped[(rule,)], metric)
        for ax in (ax_full, ax_zoom):
            if ax is not None:
                _plot_rule(ax, rounds, values, rule, line_style(rule))
        final = np.nanmean(values[:, -1])
        if math.isfinite(final):
            finals.append(float(final))
    level = chance(runs, metric)
    _chance_line(ax_full, level)
    ax_full.set_title(scenario_title(scenario, runs, short))
    ax_full.set_xlabel("round")
    ax_full.set_ylabel(metric_label(metric, runs))
    ax_full.set_ylim(0, 1)
    if ax_zoom is not None and finals:
        _zoom(ax_zoom, max(r["rounds"] for r in results), finals, level + FAILED_ABOVE_CHANCE)
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
        shown = [r for r in paper if r["scenario"] == scenario]
        fig.suptitle(_caption(shown, metric), fontsize=9)
        paths.append(save(fig, out / f"accuracy-{scenario}.png"))
    if scenarios:
        fig, axes = plt.subplots(2, len(scenarios), figsize=(4.2 * len(scenarios), 7.5),
                                 squeeze=False, constrained_layout=True)
        for full, zoom, scenario in zip(axes[0], axes[1], scenarios, strict=True):
            draw_scenario(full, zoom, paper, scenario, metric, rules, short=True)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
        fig.suptitle(_caption(paper, metric), fontsize=10)
        paths.append(save(fig, out / "accuracy-grid.png"))
    return paths


def run_caption(results: list[dict[str, Any]]) -> str:
    """How the runs were made: dataset, n, the Byzantine workers of the worker attacks,
    S, rounds, seeds."""
    return (f"{_values(results, 'dataset')}; n = {_values(results, 'num_workers')}, "
            f"{_byzantine_text(results)}, S = {_values(results, 'num_shards')}; "
            f"{_values(results, 'rounds')} rounds; {len({r['seed'] for r in results})} "
            "seed(s)")


def _byzantine_text(results: list[dict[str, Any]]) -> str:
    """``f = 6 (gaussian, omniscient)``: the Byzantine workers and the scenarios that have
    them; the proxy attacks corrupt values on the wire and have none."""
    scenarios: dict[int, set[str]] = defaultdict(set)
    for r in results:
        if r.get("num_byzantine"):
            scenarios[r["num_byzantine"]].add(r.get("scenario", "?"))
    if not scenarios:
        return "no Byzantine workers"
    return ", ".join(f"f = {f} ({', '.join(sorted(s))})" for f, s in sorted(scenarios.items()))


def _caption(results: list[dict[str, Any]], metric: str) -> str:
    return (f"{run_caption(results)}; lines: mean over seeds, band: lowest to highest seed; "
            f"{metric_label(metric, results)}")


def q_sweep_figure(out: Path, results: list[dict[str, Any]], metric: str) -> Path | None:
    """``q-sweep.png``: final accuracy against q, one panel per attack swept (bit-flip,
    the gambler), one line per rule."""
    sweep = [r for r in results if r["figure"] == "q-sweep"]
    if not sweep:
        return None
    plt = pyplot()
    panels = sorted(_by(sweep, "scenario").items(),
                    key=lambda kv: SCENARIOS.index(kv[0][0]) if kv[0][0] in SCENARIOS else 99)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, ((scenario,), runs) in zip(axes[0], panels, strict=True):
        for (rule,), rule_runs in _by(runs, "rule").items():
            points = sorted(_by(rule_runs, "q").items())
            qs = [q for (q,), _ in points]
            finals = [[_finite(r["points"][-1][metric]) for r in group] for _, group in points]
            ax.errorbar(qs, [np.nanmean(f) for f in finals],
                        yerr=[np.nanstd(f) for f in finals], capsize=3, label=rule,
                        **line_style(rule))
        _chance_line(ax, chance(runs, metric))
        ax.set_title(f"q sweep under {scenario_title(scenario, runs)}", fontsize=9)
        ax.set_xlabel("q (Byzantine values assumed per coordinate)")
        ax.set_ylabel(f"final {metric_label(metric, runs)}")
        ax.set_ylim(0, 1)
        ax.legend()
    fig.suptitle(run_caption(sweep) + "; mean ± std over seeds", fontsize=9)
    return save(fig, out / "q-sweep.png")


def batch_sweep_figure(out: Path, results: list[dict[str, Any]], metric: str
                       ) -> Path | None:
    """``batch-sweep.png``: without attack, lr scaled with the batch: each rule's final
    accuracy against the batch size, and its gap to Mean at the same batch size (Mean's
    final minus its own, paired by seed: the paper's "the gap narrows as the batch
    grows")."""
    sweep = [r for r in results if r["figure"] == "batch-sweep"]
    if not sweep:
        return None
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    finals: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in sweep:
        finals[r["rule"]][r["batch_size"]][r["seed"]] = _finite(r["points"][-1][metric])
    for rule, by_batch in finals.items():
        batches = sorted(by_batch)
        values = [list(by_batch[b].values()) for b in batches]
        left.errorbar(batches, [np.nanmean(v) for v in values],
                      yerr=[np.nanstd(v) for v in values], capsize=3, label=rule,
                      **line_style(rule))
        if rule == "mean" or "mean" not in finals:
            continue
        shared = [b for b in batches if b in finals["mean"]]
        gaps = [[finals["mean"][b][s] - by_batch[b][s] for s in by_batch[b]
                 if s in finals["mean"][b]] for b in shared]
        right.errorbar(shared, [np.nanmean(g) for g in gaps],
                       yerr=[np.nanstd(g) for g in gaps], capsize=3, label=rule,
                       **line_style(rule))
    _chance_line(left, chance(sweep, metric))
    right.axhline(0.0, color="grey", linewidth=0.8)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (lr = base lr × batch / base batch)")
    left.set_title("final accuracy without attack")
    left.set_ylabel(f"final {metric_label(metric, sweep)}")
    left.set_ylim(0, 1)
    left.legend(fontsize=8, ncol=2)
    right.set_title("gap to Mean at the same batch size (Mean − rule, paired by seed)")
    right.set_ylabel(f"difference of final {metric_label(metric, sweep)}")
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=8, ncol=2)
    fig.suptitle(run_caption(sweep) + "; mean ± std over seeds", fontsize=9)
    return save(fig, out / "batch-sweep.png")


def draw_all(out: Path, results: list[dict[str, Any]], metric: str) -> list[Path]:
    """Every figure the results support."""
    paths = grid_figures(out, results, metric)
    paths += [p for p in (q_sweep_figure(out, results, metric),
                          batch_sweep_figure(out, results, metric)) if p is not None]
    return paths


def _file_caption(results: list[dict[str, Any]], metric: str, axes) -> str:
    """How a grid file's worst-case figure was made, from its results."""
    return (f"{run_caption(results)}; worst case over {axes.worst_over} of the mean final "
            f"{metric_label(metric, results)} over seeds")


def worst_case_curves(out: Path, tables: list[Table], axes, metric: str,
                      results: list[dict[str, Any]]) -> Path:
    """``worst-curves.png``: accuracy against rounds of each row at its worst case, one
    panel per column of each table (one set of ``worst_over`` values, in its title),
    above a zoom on the late rounds near the best final, at most ``PANELS_PER_ROW``
    panels a row; the band spans the seeds."""
    plt = pyplot()
    panels = [(table.panel, column, {r: case for (r, c), case in table.cells.items()
                                     if c == column and case is not None})
              for table in tables for column in table.columns]
    rows = list(dict.fromkeys(r for _, _, lines in panels for r in lines))
    per_row = min(len(panels), PANELS_PER_ROW)
    pairs = -(-len(panels) // per_row)  # rows of panels, each above its zoom
    fig, grid = plt.subplots(2 * pairs, per_row, figsize=(4.4 * per_row, 7.5 * pairs),
                             squeeze=False, constrained_layout=True)
    slots = [grid[2 * (k // per_row):2 * (k // per_row) + 2, k % per_row]
             for k in range(pairs * per_row)]
    level = chance(results, metric)
    last = max(r["rounds"] for r in results)
    for (ax, zoom), (panel, column, lines) in zip(slots, panels, strict=False):
        finals = []
        for row in rows:
            if row not in lines:
                continue
            rounds, values = curves(lines[row].runs, metric)
            for target in (ax, zoom):
                _plot_rule(target, rounds, values, row, line_style(row))
            if math.isfinite(lines[row].mean):
                finals.append(lines[row].mean)
        _chance_line(ax, level)
        if finals:
            _zoom(zoom, last, finals, level + FAILED_ABOVE_CHANCE)
        zoom.set_title("zoom: late rounds", fontsize=9)
        zoom.set_xlabel("round")
        title = f"{panel.title(axes.worst_over)}; {axes.columns} = {column}"
        ax.set_title(textwrap.fill(title, 48), fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(metric_label(metric, results))
        ax.set_ylim(0, 1)
    for unused in slots[len(panels):]:
        for ax in unused:
            ax.set_visible(False)
    handles, labels = grid[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6))
    fig.suptitle(_file_caption(results, metric, axes) + f"; lines: {axes.rows}", fontsize=9)
    return save(fig, out / "worst-curves.png")
