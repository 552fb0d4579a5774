"""What a grid leaves behind: ``results.jsonl`` (every evaluation point of every cell)
and ``report.md`` (the final-accuracy table, rule x scenario, mean +- std over seeds, the
figures, a verdict on each of the paper's claims, the sweeps, the cluster verification)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ps.experiments.claims import (
    CLAIMS,
    CLOSE,
    CONVERGED,
    DIFFERS,
    FAIL_MARGIN,
    HOLDS,
    INCONCLUSIVE,
    NEAR,
    NOT_RUN,
    Measures,
    judge,
)
from ps.experiments.grid import SCENARIOS, evaluated_on


def write_results(out: Path, results: list[dict[str, Any]]) -> Path:
    """One line per evaluation point, with its cell's settings."""
    path = out / "results.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for r in results:
            cell = {k: v for k, v in r.items() if k != "points"}
            for point in r["points"]:
                f.write(json.dumps({**cell, **point}) + "\n")
    return path


def final_table(results: list[dict[str, Any]], metric: str
                ) -> dict[str, dict[str, list[float]]]:
    """rule -> scenario -> the final metric of each seed (the paper grid only)."""
    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r["figure"] == "paper":
            table[r["rule"]][r["scenario"]].append(r["points"][-1][metric])
    return table


def _cell_text(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


@dataclass
class ReportInfo:
    """How the grid was made, for the report's header."""

    command: str
    wall_s: float
    metric: str
    engine: str
    figures: list[Path]
    verification: list[dict[str, Any]] | None = None  # the --verify-sample cells
    not_run: int = 0  # distinct runs of the grid left out (--cached-only)


def write_report(out: Path, results: list[dict[str, Any]], info: ReportInfo) -> Path:
    """``report.md``: how it was made, the final table, the figures, a verdict per claim
    of the paper, the sweeps and the verification."""
    lines = header(results, info, paper=True) + _table(results, info.metric)
    names = {p.name for p in info.figures}
    lines += _figures(names, ["accuracy-grid.png"] + [f"accuracy-{s}.png" for s in SCENARIOS])
    lines += _claims(results, info.metric)
    lines += _sweeps(results, info.metric)
    lines += _figures(names, ["q-sweep.png", "batch-sweep.png"])
    if info.verification is not None:
        lines += verification_lines(info.verification)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def header(results: list[dict[str, Any]], info: ReportInfo, paper: bool = False
           ) -> list[str]:
    """The report's first lines: the command, the time, the dataset (for the ``paper``
    grid: against the paper's), the engine."""
    distinct = {r["key"]: r for r in results}
    datasets = sorted({r["dataset"] for r in results})
    note = ""
    if paper and not any(d.startswith("mnist") or d == "cifar10" for d in datasets):
        note = (" (the paper uses MNIST; give `--dataset mnist --data-dir DIR` (or "
                "`--dataset mnist-5k`, 5,000 real digits) for it: "
                "Fashion-MNIST is harder, so every accuracy is lower, but the claims are "
                "about how the rules compare)")
    engine = {"reference": "the in-process reference engine (its final parameters are "
                           "bit-identical to a cluster run's)",
              "cluster": "real ps-server, ps-worker and ps-proxy processes per cell"}
    return [
        "# Experiment report",
        "",
        f"* Command: `{info.command}`",
        f"* Wall time of this invocation: {info.wall_s:.0f} s; the {len(distinct)} distinct "
        f"runs took {sum(r['seconds'] for r in distinct.values()) / 60:.0f} min of "
        "single-core compute in all (cached ones included)",
        f"* Dataset: {', '.join(datasets)}{note}",
        f"* Rounds: {', '.join(map(str, sorted({r['rounds'] for r in results})))}; seeds: "
        f"{', '.join(map(str, sorted({r['seed'] for r in results})))}; metric: "
        f"{info.metric}",
        f"* Engine: {engine[info.engine]}",
        *_evaluation_line(results),
        *([f"* **Unfinished**: {info.not_run} of the grid's {len(distinct) + info.not_run} "
           "distinct runs are not run yet (`--cached-only`): every claim reads the seeds "
           "its cells share"] if info.not_run else []),
    ]


def _evaluation_line(results: list[dict[str, Any]]) -> list[str]:
    """Where the runs under ``--validation`` were evaluated (nothing without any)."""
    shares = sorted({r["validation"] for r in results if r.get("validation")})
    if not shares:
        return []
    which = "every run" if evaluated_on(results) == "validation" else "the runs with it"
    return [f"* Evaluation set: a validation split of the training set, not the test set "
            f"(`--validation {', '.join(f'{v:g}' for v in shares)}`, {which}): stratified by "
            "class, the same samples for every seed, held out of every worker's data"]


def _table(results: list[dict[str, Any]], metric: str) -> list[str]:
    table = final_table(results, metric)
    scenarios = [s for s in SCENARIOS if any(s in row for row in table.values())]
    lines = ["", f"## Final {evaluated_on(results)} {metric} (mean ± std over seeds)", "",
             "| rule | " + " | ".join(scenarios) + " |", "|---|" + "---|" * len(scenarios)]
    lines += [f"| {rule} | " + " | ".join(_cell_text(row.get(s, [])) for s in scenarios)
              + " |" for rule, row in table.items()]
    return lines


def _figures(names: set[str], wanted: list[str]) -> list[str]:
    return [line for name in wanted if name in names for line in ("", f"![{name}]({name})")]


def _claims(results: list[dict[str, Any]], metric: str) -> list[str]:
    measures = Measures(results, metric)
    verdicts = [(c, judge(c, measures)) for c in CLAIMS]
    count = {o: sum(v.outcome == o for _, v in verdicts)
             for o in (HOLDS, DIFFERS, INCONCLUSIVE, NOT_RUN)}
    lines = ["", "## The paper's claims", "",
             f"{count[HOLDS]} hold, {count[DIFFERS]} differ, {count[INCONCLUSIVE]} "
             f"inconclusive, {count[NOT_RUN]} not run. "
             "Thresholds (`ps/experiments/claims.py`): fails = final below chance + "
             f"{FAIL_MARGIN}; converges = final ≥ {CONVERGED} × Mean's without attack; ~ = "
             f"within {CLOSE}; close = within {NEAR}; speed = mean {metric} over all "
             "evaluations (area under the curve). Every rule runs on the same seeds, so "
             "each comparison is paired by seed: the 95 % Student-t interval of the mean "
             "difference over the seeds both sides share decides it when it excludes 0 (an "
             "equivalence: when it lies inside ±the tolerance); otherwise, or with a single "
             "seed, it is inconclusive. A claim holds when all its comparisons hold (5 % "
             "each, no correction for the page's many claims: a decisive verdict whose "
             "interval ends near its bound may be a chance finding). Numbers: mean over "
             "seeds ± half its 95 % interval; a difference: mean [95 % interval].", "",
             "| scenario | the paper says | here | numbers |", "|---|---|---|---|"]
    for claim, verdict in verdicts:
        mark = {HOLDS: "holds", DIFFERS: "**differs**", INCONCLUSIVE: "inconclusive",
                NOT_RUN: "not run"}[verdict.outcome]
        why = f" *Why*: {claim.why_not}" if verdict.outcome == DIFFERS and claim.why_not \
            else ""
        lines.append(f"| {claim.scenario} | {claim.text} | {mark} | {verdict.evidence}.{why} |")
    return lines


def _sweeps(results: list[dict[str, Any]], metric: str) -> list[str]:
    lines = []
    for figure, axis in (("q-sweep", "q"), ("batch-sweep", "batch_size")):
        sweep = [r for r in results if r["figure"] == figure]
        if not sweep:
            continue
        grouped: dict[tuple[str, str, int], list[float]] = defaultdict(list)
        for r in sweep:
            grouped[(r["scenario"], r["rule"], r[axis])].append(r["points"][-1][metric])
        lines += ["", f"## {figure}: final {metric} by {axis}", "",
                  f"| attack | rule | {axis} | {metric} |", "|---|---|---|---|"]
        lines += [f"| {scenario} | {rule} | {x} | {_cell_text(v)} |"
                  for (scenario, rule, x), v in sorted(grouped.items())]
    return lines


def verification_lines(checked: list[dict[str, Any]]) -> list[str]:
    """The report's section on the ``--verify-sample`` cells."""
    same = sum(c["same"] for c in checked)
    lines = ["", "## Cluster verification", "",
             f"{len(checked)} cells run again through real processes (`--verify-sample`): "
             f"{same} end with bit-identical parameters.", "",
             "| cell | reference sha256 | cluster sha256 | same |", "|---|---|---|---|"]
    lines += [f"| {c['label']} | `{c['reference'][:16]}` | `{c['cluster'][:16]}` | "
              f"{'yes' if c['same'] else '**no**'} |" for c in checked]
    return lines
