"""The modern grid: the field's newer defences against its newer attacks, with and without
worker momentum (issue 12; the comparison ByzFL and Blades publish).

Rows are defences: a rule, optionally after a pre-aggregation chain (``nnm+trimmed-mean``
is ``--pre nnm --rule trimmed-mean``). Columns are Byzantine-worker attacks: ALIE, IPM,
Min-Max, Min-Sum (Shejwalkar and Houmansadr, NDSS 2021), Mimic, label flipping and Inf,
each by the first 6 of the n = 20 workers (30 %, as in the paper's classic-model
scenarios), every rule told q = 6. Each pair runs with worker momentum 0 (the paper's SGD)
and 0.9 (the field's benchmarks). The report is one table per momentum (final accuracy,
mean +- std over seeds, and each defence's worst case over the attacks) and a heat map.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import ConfigError
from common.learn.rules import rule_names
from common.learn.rules.pre import pre_names
from ps.experiments.claims import TIES_RULE, ties, ties_text
from ps.experiments.grid import Cell, GridSpec, byzantine_workers, largest_q

MODERN_DEFENCES = ("mean", "trimmed-mean", "nnm+trimmed-mean", "krum", "nnm+krum",
                   "centered-clipping", "bucketing+centered-clipping", "marmed", "meamed")
MODERN_ATTACKS = ("none", "alie", "ipm", "minmax", "minsum", "mimic", "labelflip", "inf",
                  "alie-opt", "ipm-opt")
MOMENTA = (0.0, 0.9)
MODERN_ROUNDS = 300


def parse_defence(text: str) -> tuple[str | None, str]:
    """``(pre chain or None, rule)`` of a defence written ``[PRE+...+]RULE``."""
    *pre, rule = text.split("+")
    unknown = [p for p in pre if p not in pre_names()]
    if unknown:
        raise ConfigError(f"defence {text!r}: unknown pre-aggregation {', '.join(unknown)}; "
                          f"valid: {', '.join(pre_names())}")
    if rule not in rule_names():
        raise ConfigError(f"defence {text!r}: unknown rule {rule!r}; valid: "
                          f"{', '.join(rule_names())}")
    return (",".join(pre) or None), rule


@dataclass(frozen=True)
class ModernSpec:
    """Which modern grid to run."""

    grid: GridSpec
    defences: tuple[str, ...] = MODERN_DEFENCES
    attacks: tuple[str, ...] = MODERN_ATTACKS
    momenta: tuple[float, ...] = MOMENTA


def modern_cells(spec: ModernSpec) -> list[Cell]:
    """Every cell: seeds x momenta x attacks x defences."""
    n = spec.grid.num_workers
    f = len(byzantine_workers(n))
    cells = []
    for seed in range(spec.grid.seeds):
        for beta in spec.momenta:
            for attack in spec.attacks:
                settings = ({} if attack == "none" else
                            {"worker_attack": attack, "byzantine_workers": byzantine_workers(n)})
                for defence in spec.defences:
                    pre, rule = parse_defence(defence)
                    run = {**spec.grid.base(seed), "rule": rule, "pre": pre,
                           "q": largest_q(rule, n, f), "worker_momentum": beta}
                    cells.append(Cell("modern", attack, run, settings))
    return cells


def final_by_defence(results: list[dict[str, Any]], metric: str
                     ) -> dict[float, dict[str, dict[str, list[float]]]]:
    """momentum -> defence -> attack -> the final metric of each seed."""
    table: dict[float, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for r in results:
        if r["figure"] == "modern":  # a cell cached by an older grid may lack the fields
            row = table[r.get("worker_momentum", 0.0)][r.get("defence", r["rule"])]
            row[r["scenario"]].append(_finite(r["points"][-1][metric]))
    return table


def _finite(value: float | None) -> float:
    return float(value) if value is not None and np.isfinite(value) else float("nan")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return statistics.fmean(finite) if finite else float("nan")


def _text(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1 or any(not np.isfinite(v) for v in values):
        return f"{_mean(values):.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def modern_tables(results: list[dict[str, Any]], metric: str, attacks: tuple[str, ...]
                  ) -> list[str]:
    """Markdown: one table per momentum, defences x attacks, and each defence's worst
    final accuracy over the attacks (``none`` excluded)."""
    lines: list[str] = []
    for beta, rows in sorted(final_by_defence(results, metric).items()):
        cols = [a for a in attacks if any(a in row for row in rows.values())]
        lines += ["", f"### Worker momentum {beta:g}: final test {metric}", "",
                  "| defence | " + " | ".join(cols) + " | worst attack |",
                  "|---|" + "---|" * (len(cols) + 1)]
        for defence, row in rows.items():
            attacked = {a: _mean(row[a]) for a in cols if a != "none" and row.get(a)}
            worst = min(attacked.items(), key=lambda kv: kv[1] if np.isfinite(kv[1])
                        else -1.0, default=None)
            worst_text = "-" if worst is None else (
                f"{worst[1]:.3f} ({worst[0]}"
                + ties_text(ties(row[worst[0]], {a: row[a] for a in attacked
                                                 if a != worst[0]})) + ")")
            lines.append(f"| {defence} | " + " | ".join(_text(row.get(a, [])) for a in cols)
                         + f" | {worst_text} |")
    return lines


def modern_figure(out: Path, results: list[dict[str, Any]], metric: str,
                  attacks: tuple[str, ...], f: int, n: int) -> Path | None:
    """``modern-grid.png``: a heat map of the final accuracy (defence x attack), one panel
    per worker momentum, each value written in its square."""
    from ps.plots.style import pyplot, save

    table = final_by_defence(results, metric)
    if not table:
        return None
    plt = pyplot()
    panels = sorted(table.items())
    defences = list(panels[0][1])
    cols = [a for a in attacks if any(a in row for _, rows in panels for row in rows.values())]
    fig, axes = plt.subplots(1, len(panels), figsize=(1.1 * len(cols) * len(panels) + 2.5,
                                                      0.5 * len(defences) + 1.8),
                             squeeze=False, constrained_layout=True)
    image = None
    for ax, (beta, rows) in zip(axes[0], panels, strict=True):
        values = np.array([[_mean(rows.get(d, {}).get(a, [])) for a in cols]
                           for d in defences])
        image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, "NaN" if not np.isfinite(v) else f"{v:.2f}", ha="center",
                    va="center", fontsize=8, color="white" if not v > 0.6 else "black")
        ax.set_xticks(range(len(cols)), cols, rotation=35, ha="right")
        ax.set_yticks(range(len(defences)), defences)
        ax.grid(False)
        ax.set_title(f"worker momentum {beta:g}")
        ax.set_xlabel(f"attack (by the first {f} of the {n} workers)")
    fig.colorbar(image, ax=axes[0].tolist(), label=f"final test {metric}")
    from ps.experiments.figures import run_caption

    fig.suptitle("Modern defences against modern attacks: "
                 + run_caption([r for r in results if r["figure"] == "modern"]), fontsize=9)
    return save(fig, out / "modern-grid.png")


def write_modern_report(out: Path, results: list[dict[str, Any]], metric: str,
                        attacks: tuple[str, ...], header: list[str], num_workers: int,
                        verification: list[str] | None = None) -> Path:
    """``report.md`` of a modern grid: ``header`` (how it was made), the tables, the heat
    map and the ``verification`` section if any."""
    f = len(byzantine_workers(num_workers))
    figure = modern_figure(out, results, metric, attacks, f, num_workers)
    lines = [*header, "", "## Final accuracy by defence and attack", "",
             f"Attacks by the first {f} of the {num_workers} workers; every rule told q = {f} "
             "(or the largest q it accepts below that). *worst attack*: the lowest final "
             f"accuracy over the attacks. {TIES_RULE}"]
    lines += modern_tables(results, metric, attacks)
    if figure is not None:
        lines += ["", f"![{figure.name}]({figure.name})"]
    lines += verification or []
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
