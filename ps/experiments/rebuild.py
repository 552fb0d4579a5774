"""A finished grid's outputs rebuilt from what it leaves: ``results.jsonl`` (or
``results.jsonl.gz``), ``grid.json`` (which grid, and how its report is laid out) and
``verify.json`` (the ``--verify-sample`` record, if any); ``ps-experiment report DIR``.
The ``cells/`` cache is not read and nothing runs, so a directory committed without its
cache (``docs/results/<grid>/``) regenerates the same tables."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from ps.experiments.report import ReportInfo

GRID_JSON = "grid.json"
RESULTS = "results.jsonl"
VERIFY_FILE = "verify.json"  # the last --verify-sample results, shown in every report
POINT_KEYS = ("round", "top1", "top3", "loss")  # an evaluation point's fields
PAPER, MODERN, FILE = "paper", "modern", "file"  # the kinds of grid


def paper_grid() -> dict[str, Any]:
    """``grid.json``'s description of ``ps-experiment paper``."""
    return {"grid": PAPER}


def modern_grid(attacks: tuple[str, ...], num_workers: int) -> dict[str, Any]:
    """``grid.json``'s description of ``ps-experiment modern``: its columns and n."""
    return {"grid": MODERN, "attacks": list(attacks), "num_workers": num_workers}


def file_grid(grid: Any) -> dict[str, Any]:
    """``grid.json``'s description of a grid file (a ``GridFile``): its name, axes and
    ``[report]`` table."""
    report = None if grid.report is None else dataclasses.asdict(grid.report)
    return {"grid": FILE, "name": grid.name, "axes": list(grid.axes), "report": report}


def render(out: Path, results: list[dict[str, Any]], info: ReportInfo,
           grid: dict[str, Any]) -> Path:
    """Draw the figures and write ``report.md`` of the grid ``grid`` describes."""
    if grid["grid"] == PAPER:
        from ps.experiments.figures import draw_all
        from ps.experiments.report import write_report

        info.figures = draw_all(out, results, info.metric)
        return write_report(out, results, info)
    from ps.experiments.report import header, verification_lines

    if grid["grid"] == MODERN:
        from ps.experiments.modern import write_modern_report

        checked = verification_lines(info.verification) if info.verification else None
        return write_modern_report(out, results, info.metric, tuple(grid["attacks"]),
                                   header(results, info), grid["num_workers"], checked)
    from ps.experiments.filereport import write_file_report
    from ps.experiments.gridfile import GridFile, ReportAxes

    report = grid["report"]
    axes = None if report is None else ReportAxes(
        **{**report, "at_rounds": tuple(report.get("at_rounds", ()))})
    return write_file_report(out, results, info,
                             GridFile(grid["name"], [], tuple(grid["axes"]), {}, axes))


def write_grid(out: Path, grid: dict[str, Any], info: ReportInfo) -> Path:
    """``grid.json``: the grid's description and how the report was made (command, wall
    time, metric, engine), all that :func:`regenerate` needs beside the results."""
    path = out / GRID_JSON
    record = {**grid, "command": info.command, "wall_s": info.wall_s, "metric": info.metric,
              "engine": info.engine, **({"not_run": info.not_run} if info.not_run else {})}
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def read_results(directory: Path) -> list[dict[str, Any]]:
    """The records of ``results.jsonl`` (or ``results.jsonl.gz``): its lines regrouped,
    one record per run of consecutive lines with the same cell fields and rising
    rounds, the inverse of ``report.write_results``."""
    plain, packed = directory / RESULTS, directory / f"{RESULTS}.gz"
    if plain.exists():
        text = plain.read_text(encoding="utf-8")
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode("utf-8")
    else:
        raise ConfigError(f"{directory}: no {RESULTS} or {RESULTS}.gz")
    records: list[dict[str, Any]] = []
    for line in text.splitlines():
        row = json.loads(line)
        cell = {k: v for k, v in row.items() if k not in POINT_KEYS}
        point = {k: row[k] for k in POINT_KEYS if k in row}
        last = records[-1] if records else None
        if last is not None and {k: v for k, v in last.items() if k != "points"} == cell \
                and last["points"][-1]["round"] < point["round"]:
            last["points"].append(point)
        else:
            records.append({**cell, "points": [point]})
    return records


def read_verification(directory: Path) -> list[dict[str, Any]] | None:
    """The ``--verify-sample`` record kept in ``verify.json``, if any."""
    try:
        return json.loads((directory / VERIFY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def regenerate(directory: Path, out: Path | None = None) -> Path:
    """Rewrite ``report.md`` and the figures of the finished grid in ``directory`` (into
    ``out``, by default the same directory) from its results alone; ``ConfigError`` if
    it lacks them."""
    try:
        grid = json.loads((directory / GRID_JSON).read_text(encoding="utf-8"))
    except OSError:
        raise ConfigError(f"{directory}: no {GRID_JSON} (each grid run writes one beside "
                          f"{RESULTS}; run the grid again: its cells are cached)") from None
    results = read_results(directory)
    info = ReportInfo(grid["command"], grid["wall_s"], grid["metric"], grid["engine"], [],
                      read_verification(directory), grid.get("not_run", 0))
    out = directory if out is None else out
    out.mkdir(parents=True, exist_ok=True)
    return render(out, results, info, grid)
