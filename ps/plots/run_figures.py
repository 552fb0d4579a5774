"""The figures of one run, drawn from the files its processes wrote (``ps-cluster`` or
``ps-simulate`` ``--out-dir``): ``accuracy.png``, ``round_time.png``, ``corruption.png``,
``aggregation.png`` and ``partition.png`` (from ``partition.json``). A figure whose
files are missing or empty is skipped.

A ``ps-simulate`` directory has no server or proxy files: its ``engine.jsonl`` (each
shard's aggregation time and the values corrupted, per round) stands in for them.

A process's metrics file ``<name>.jsonl`` is read from the run directory itself
(``ps-cluster``, ``ps-simulate``) or from ``<name>/`` in it: the layout of a
docker-compose run, where each container writes only its own directory
(``runs/compose/server-0/server-0.jsonl``, ...). The figures go to the run directory.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from common.learn.data.sampling import PARTITION_FILE
from common.run.config import RUN_CONFIG_FILE
from common.run.metrics import read_jsonl
from ps.plots.style import pyplot, rule_colour, save

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

log = logging.getLogger("ps.plots")

ENGINE_FILE = "engine.jsonl"  # ps-simulate: per round, aggregation_ms per shard, corrupted
WIDE_RANGE = 100.0  # values spanning more than this factor get a logarithmic axis

Line = tuple[Sequence[float], Sequence[float]]  # (rounds, values)
Series = dict[str, Line]  # label -> line


def read_rounds(path: Path, field: str) -> list[dict[str, Any]]:
    """The lines of ``path`` holding ``field``, one per round in round order (the last
    line of a round wins, as after a resumed server)."""
    by_round = {r["round"]: r for r in read_jsonl(path) if "round" in r and field in r}
    return [by_round[t] for t in sorted(by_round)]


def metrics_file(run_dir: Path, name: str) -> Path:
    """``run_dir/<name>.jsonl``, or when only a service directory holds it (a compose
    run's per-service directories) ``run_dir/<name>/<name>.jsonl``, or the one in the
    directory of the server process that hosted it (``server-0/server-1.jsonl``)."""
    flat = run_dir / f"{name}.jsonl"
    if flat.exists():
        return flat
    nested = run_dir / name / f"{name}.jsonl"
    if nested.exists():
        return nested
    prefix = name.split("-", 1)[0]
    hosted = sorted(run_dir.glob(f"{prefix}-*/{name}.jsonl"))
    return hosted[0] if hosted else flat


def numbered(run_dir: Path, prefix: str) -> dict[int, Path]:
    """``prefix-<i>.jsonl`` files of ``run_dir`` (or of its ``prefix-<i>/``) by ``i``, in
    order."""
    found = {}
    paths = [*run_dir.glob(f"{prefix}-*.jsonl"), *run_dir.glob(f"{prefix}-*/{prefix}-*.jsonl")]
    for path in paths:
        suffix = path.stem[len(prefix) + 1:]
        if suffix.isdigit() and path == metrics_file(run_dir, path.stem):
            found[int(suffix)] = path
    return dict(sorted(found.items()))


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.json`` (``{"run": ..., "attack": ...}``); empty if unreadable."""
    try:
        config = json.loads((run_dir / RUN_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def run_title(config: dict[str, Any]) -> str:
    """One line naming the run's rule, size and attacks ("" without a config)."""
    run, attack = config.get("run", {}), config.get("attack", {})
    parts = []
    if run:
        parts.append(f"{run['rule']} (q={run['q']}), n={run['num_workers']}, "
                     f"S={run['num_shards']}, {run['dataset']}")
    if attack.get("worker_attack", "none") != "none":
        parts.append(f"{attack['worker_attack']} from "
                     f"{_ids('worker', attack['byzantine_workers'])}")
    if attack.get("proxy_attack", "none") != "none":
        params = " (and PARAMS)" if attack.get("corrupt_params") else ""
        parts.append(f"proxy {attack['proxy_attack']}{params} on "
                     f"{_ids('shard', attack['proxy_shards'])}")
    return "; ".join(parts)


def _ids(what: str, ids: list[int]) -> str:
    """``worker 3`` or ``workers 0,1``."""
    return f"{what}{'s' if len(ids) > 1 else ''} {','.join(map(str, ids))}"


def _figure(title: str, config: dict[str, Any], panels: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure of ``panels`` side by side, titled ``title`` and the run."""
    fig, axes = pyplot().subplots(1, panels, figsize=(5.2 * panels, 3.8), squeeze=False,
                                  layout="constrained")
    fig.suptitle("\n".join(filter(None, (title, run_title(config)))))
    return fig, list(axes[0])


def _scale_y(ax: Axes, values: list[float]) -> None:
    """A logarithmic y axis when the positive ``values`` span more than ``WIDE_RANGE``
    (symmetric-log when some are zero or negative), else a linear one from 0."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if not positive or max(positive) / min(positive) <= WIDE_RANGE:
        if values and min(values) >= 0:
            ax.set_ylim(bottom=0)
        return
    if len(positive) == len(values):
        ax.set_yscale("log")
    else:
        ax.set_yscale("symlog", linthresh=min(positive))


def _plot_series(ax: Axes, series: Series, ylabel: str) -> None:
    """One line per series, a legend, and a y scale that fits them."""
    for label, (rounds, values) in series.items():
        ax.plot(rounds, values, label=label, linewidth=1)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.legend()
    _scale_y(ax, [v for _, values in series.values() for v in values])


def draw_accuracy(run_dir: Path, config: dict[str, Any]) -> Path | None:
    """``accuracy.png``: test top-1 and top-3, and test loss (its finite points; the
    title says when it diverged), against rounds; the validation split's under
    ``--validation``."""
    evals = read_rounds(metrics_file(run_dir, "evaluator"), "top1")
    if not evals:
        return None
    colour = rule_colour(config.get("run", {}).get("rule", ""))
    split = "validation" if config.get("run", {}).get("validation") else "test"
    fig, (acc, loss) = _figure(f"{split.capitalize()} accuracy and loss", config, panels=2)
    rounds = [e["round"] for e in evals]
    acc.plot(rounds, [e["top1"] for e in evals], "-o", color=colour, markersize=3,
             label="top-1")
    acc.plot(rounds, [e["top3"] for e in evals], "--", color=colour, label="top-3")
    acc.set(xlabel="round", ylabel="accuracy", ylim=(0, 1), title=f"{split} accuracy")
    acc.legend()
    _plot_loss(loss, evals, colour, split)
    loss.set_xlim(acc.get_xlim())
    return save(fig, run_dir / "accuracy.png")


def _plot_loss(ax: Axes, evals: list[dict[str, Any]], colour: str, split: str) -> None:
    """The finite losses on ``split``; a NaN or infinite one is marked as the
    divergence."""
    finite = [(e["round"], e["loss"]) for e in evals if math.isfinite(e["loss"])]
    ax.plot([t for t, _ in finite], [v for _, v in finite], "-o", color=colour, markersize=3)
    diverged = next((e["round"] for e in evals if not math.isfinite(e["loss"])), None)
    if diverged is not None:
        ax.axvline(diverged, color="red", linestyle=":")
    if not finite:
        ax.text(0.5, 0.5, "no finite loss", transform=ax.transAxes, ha="center")
    ax.set(xlabel="round", ylabel="loss", title=f"{split} loss" if diverged is None
           else f"{split} loss (diverged at round {diverged})")
    _scale_y(ax, [v for _, v in finite])


def draw_round_time(run_dir: Path, config: dict[str, Any]) -> Path | None:
    """``round_time.png``: each worker's mean compute and exchange time (stacked bars),
    and the median over workers against rounds."""
    workers = {i: rows for i, path in numbered(run_dir, "worker").items()
               if (rows := read_rounds(path, "compute_ms"))}
    if not workers:
        return None
    fig, (bars, lines) = _figure("Round time per worker", config, panels=2)
    ids = list(workers)
    compute = [np.mean([r["compute_ms"] for r in rows]) for rows in workers.values()]
    exchange = [np.mean([r["exchange_ms"] for r in rows]) for rows in workers.values()]
    bars.bar(ids, compute, label="compute")
    bars.bar(ids, exchange, bottom=compute, label="exchange")
    bars.set(xlabel="worker", ylabel="ms per round (mean)", title="per worker", xticks=ids)
    bars.legend()
    medians: Series = {part: _median_by_round(workers.values(), f"{part}_ms")
                       for part in ("compute", "exchange")}
    _plot_series(lines, medians, "ms (median over workers)")
    lines.set_title("against rounds")
    return save(fig, run_dir / "round_time.png")


def _median_by_round(runs: Iterable[list[dict[str, Any]]], field: str) -> Line:
    """(rounds, median of ``field`` over the runs that have that round)."""
    by_round: dict[int, list[float]] = {}
    for rows in runs:
        for r in rows:
            by_round.setdefault(r["round"], []).append(r[field])
    rounds = sorted(by_round)
    return rounds, [float(np.median(by_round[t])) for t in rounds]


def draw_corruption(run_dir: Path, config: dict[str, Any]) -> Path | None:
    """``corruption.png``: the values each proxy corrupted per round (in pushes, and in
    PARAMS replies with --corrupt-params)."""
    series = _proxy_corruption(run_dir) or _engine_corruption(run_dir, config)
    if not series:
        return None
    fig, (ax,) = _figure("Values corrupted in flight per round", config)
    _plot_series(ax, series, "values corrupted")
    return save(fig, run_dir / "corruption.png")


def _proxy_corruption(run_dir: Path) -> Series:
    """From ``proxy-<s>.jsonl``: per proxy, its pushes' and its PARAMS' counts."""
    series: Series = {}
    for s, path in numbered(run_dir, "proxy").items():
        rows = read_rounds(path, "corrupted_values")
        if rows:
            series[f"proxy {s}: pushes"] = ([r["round"] for r in rows],
                                            [r["corrupted_values"] for r in rows])
        params: dict[int, int] = {}
        for r in read_jsonl(path):
            if "params_corrupted" in r:
                params[r["round"]] = params.get(r["round"], 0) + r["params_corrupted"]
        if params:
            series[f"proxy {s}: PARAMS"] = (sorted(params), [params[t] for t in sorted(params)])
    return series


def _engine_corruption(run_dir: Path, config: dict[str, Any]) -> Series:
    """From ``engine.jsonl``, when the run has proxies: all proxies together."""
    attack = config.get("attack", {})
    rows = read_rounds(run_dir / ENGINE_FILE, "corrupted_values")
    if not rows or attack.get("proxy_attack") == "none":
        return {}
    return {"all proxies": ([r["round"] for r in rows], [r["corrupted_values"] for r in rows])}


def draw_aggregation(run_dir: Path, config: dict[str, Any]) -> Path | None:
    """``aggregation.png``: each shard's aggregation time per round (its median in the
    legend)."""
    times = _server_aggregation(run_dir) or _engine_aggregation(run_dir)
    if not times:
        return None
    series: Series = {f"shard {s} (median {np.median(ms):.2f} ms)": (rounds, ms)
                      for s, (rounds, ms) in times.items()}
    fig, (ax,) = _figure("Aggregation time per shard", config)
    _plot_series(ax, series, "aggregation ms")
    return save(fig, run_dir / "aggregation.png")


def _server_aggregation(run_dir: Path) -> dict[int, Line]:
    """From ``server-<s>.jsonl``: per shard, (rounds, aggregation ms)."""
    times: dict[int, Line] = {}
    for s, path in numbered(run_dir, "server").items():
        if rows := read_rounds(path, "aggregation_ms"):
            times[s] = ([r["round"] for r in rows], [r["aggregation_ms"] for r in rows])
    return times


def _engine_aggregation(run_dir: Path) -> dict[int, Line]:
    """From ``engine.jsonl``: per shard, (rounds, aggregation ms)."""
    rows = read_rounds(run_dir / ENGINE_FILE, "aggregation_ms")
    if not rows:
        return {}
    return {s: ([r["round"] for r in rows], [r["aggregation_ms"][s] for r in rows])
            for s in range(len(rows[0]["aggregation_ms"]))}


def draw_partition(run_dir: Path, config: dict[str, Any]) -> Path | None:
    """``partition.png``: how many samples of each class each worker holds (workers x
    classes heat map, from ``partition.json``), the totals per worker beside it."""
    try:
        record = json.loads((run_dir / PARTITION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    counts = np.asarray(record.get("counts", []), dtype=np.int64)
    if counts.ndim != 2 or counts.size == 0:
        return None
    n, classes = counts.shape
    fig, (heat, totals) = _figure(f"Training samples per worker and class "
                                  f"(--partition {_partition_text(record)})", config, panels=2)
    image = heat.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    heat.set(xlabel="class", ylabel="worker", xticks=range(classes),
             yticks=range(0, n, max(1, n // 20)), title="samples")
    heat.grid(False)
    fig.colorbar(image, ax=heat)
    totals.barh(range(n), counts.sum(axis=1))
    totals.set(xlabel="samples", ylabel="worker", title="per worker", ylim=heat.get_ylim())
    return save(fig, run_dir / "partition.png")


def _partition_text(record: dict[str, Any]) -> str:
    """``dirichlet, alpha 0.1`` (the partition's own parameter only)."""
    kind = str(record.get("partition", "?"))
    parameter = {"dirichlet": "alpha", "gamma": "gamma"}.get(kind)
    return f"{kind}, {parameter} {record[parameter]:g}" if parameter in record else kind


FIGURES: tuple[Callable[[Path, dict[str, Any]], Path | None], ...] = (
    draw_accuracy, draw_round_time, draw_corruption, draw_aggregation, draw_partition)


def draw_run(run_dir: Path, keep_going: bool = False) -> list[Path]:
    """Draw every figure the files in ``run_dir`` support; the paths written. With
    ``keep_going`` a figure that fails is logged and skipped instead of raising."""
    config = read_config(run_dir)
    written = []
    for draw in FIGURES:
        try:
            path = draw(run_dir, config)
        except Exception:
            if not keep_going:
                raise
            log.warning("%s could not be drawn", draw.__name__, exc_info=True)
            continue
        if path is not None:
            written.append(path)
    return written


def draw_finished_run(run_dir: Path) -> None:
    """At the end of a run: draw its figures and print one line naming them; a figure
    that fails is a warning, never the run's failure."""
    written = draw_run(run_dir, keep_going=True)
    names = ", ".join(p.name for p in written) or "none (no metrics)"
    click.echo(f"figures in {run_dir}: {names}")
