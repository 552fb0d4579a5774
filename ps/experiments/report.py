"""What a grid leaves behind: ``results.jsonl`` (every evaluation point of every cell)
and ``report.md`` (the final-accuracy table, rule x scenario, mean +- std over seeds)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ps.experiments.grid import SCENARIOS


def write_results(out: Path, results: list[dict[str, Any]]) -> Path:
    """One line per evaluation point, with its cell's settings."""
    path = out / "results.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for r in results:
            cell = {k: v for k, v in r.items() if k != "points"}
            for point in r["points"]:
                f.write(json.dumps({**cell, **point}) + "\n")
    return path


def final_table(results: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """rule -> scenario -> the final top-1 of each seed (the paper grid only)."""
    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r["figure"] == "paper":
            table[r["rule"]][r["scenario"]].append(r["points"][-1]["top1"])
    return table


def _cell_text(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def write_report(out: Path, results: list[dict[str, Any]], command: str,
                 wall_s: float) -> Path:
    """``report.md``: how it was made, and the final-accuracy table."""
    table = final_table(results)
    scenarios = [s for s in SCENARIOS if any(s in row for row in table.values())]
    paper = [r for r in results if r["figure"] == "paper"]
    seeds = sorted({r["seed"] for r in paper})
    datasets = sorted({r["dataset"] for r in results})
    rounds = sorted({r["rounds"] for r in results})
    lines = [
        "# Experiment report",
        "",
        f"Command: `{command}`; wall time {wall_s:.0f} s; dataset {', '.join(datasets)}; "
        f"{', '.join(map(str, rounds))} rounds; seeds {', '.join(map(str, seeds))}; "
        "engine: the in-process reference engine (bit-identical to a cluster run).",
        "",
        "## Final test top-1 (mean ± std over seeds)",
        "",
        "| rule | " + " | ".join(scenarios) + " |",
        "|---|" + "---|" * len(scenarios),
    ]
    for rule, row in table.items():
        lines.append(f"| {rule} | " + " | ".join(_cell_text(row.get(s, []))
                                                  for s in scenarios) + " |")
    for figure, axis in (("q-sweep", "q"), ("batch-sweep", "batch_size")):
        sweep = [r for r in results if r["figure"] == figure]
        if not sweep:
            continue
        grouped: dict[tuple[str, int], list[float]] = defaultdict(list)
        for r in sweep:
            grouped[(r["rule"], r[axis])].append(r["points"][-1]["top1"])
        lines += ["", f"## {figure}: final top-1 by {axis}", "",
                  f"| rule | {axis} | top-1 |", "|---|---|---|"]
        lines += [f"| {rule} | {x} | {_cell_text(v)} |"
                  for (rule, x), v in sorted(grouped.items())]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
