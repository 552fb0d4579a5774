"""``ps-experiment``: the paper's experiments, the modern grid and grids written in a
file (``run GRID.toml``), cached and resumable."""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from common.errors import EXIT_CONFIG, ConfigError, ReferenceMismatch
from common.learn.rules import RuleError
from common.run import plugins
from common.run.cli import options_for
from common.run.commands import COMMANDS
from common.run.process import ProcessOptions, run_process
from ps.experiments.grid import (
    EXTRA_RULES,
    MNIST_RECIPE,
    PAPER_RULES,
    RECIPES,
    SCENARIOS,
    Cell,
    GridSpec,
    paper_cells,
    recipe,
)
from ps.experiments.gridfile import INVOCATION, GridFile, load_grid, shipped
from ps.experiments.modern import (
    MODERN_ATTACKS,
    MODERN_DEFENCES,
    MODERN_ROUNDS,
    MOMENTA,
    ModernSpec,
    modern_cells,
)
from ps.experiments.rebuild import (
    VERIFY_FILE,
    file_grid,
    modern_grid,
    paper_grid,
    read_verification,
    regenerate,
)
from ps.experiments.report import ReportInfo

if TYPE_CHECKING:
    from ps.experiments.runner import CellRun

COMMAND = COMMANDS["ps-experiment"]
DEPRECATED_WORKERS = "num_workers_deprecated"  # --num-workers, the old name of --workers
MIN_WORKERS = 3  # a grid's attacks take the first 6/20 of the workers, at least one
CIFAR = RECIPES["cifar10"]
GRID_EPILOG = (
    f"Without --rounds a grid runs its recipe's: {MNIST_RECIPE.rounds} rounds (cifar10: "
    f"{CIFAR.rounds}; the modern grid: {MODERN_ROUNDS}); without --model, its dataset's: "
    f"{MNIST_RECIPE.model} ({CIFAR.model} for cifar10, with lr {CIFAR.lr:g}, batch "
    f"{CIFAR.batch_size} and top-3 accuracy). n defaults to the paper's 20; the "
    "classic-model attacks take the first 6/20 of the workers. The run settings can also be "
    "given by their PS_* variables (flag > environment > default). --num-workers is the "
    "deprecated name of --workers.")


@click.group(epilog=GRID_EPILOG, context_settings={"show_default": True})
def main() -> None:
    """Run the paper's experiments (Xie, Koyejo, Gupta 2018), and the field's newer
    defences against its newer attacks, as grids of cached cells."""
    try:
        plugins.load_plugins({})  # the installed packages' (a grid file loads its own)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def _decorated(function: Callable[..., None], options: list) -> Callable[..., None]:
    for option in reversed(options):
        function = option(function)
    return function


OUT_OPTION = click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path),
    help="Output directory (cells/, results.jsonl, report.md, *.png); run again to resume: "
    "finished cells are never recomputed.")


def grid_options(function: Callable[..., None]) -> Callable[..., None]:
    """The options every built-in grid takes: the run settings it does not vary, declared
    where every command's are (``common.run.commands``: --dataset, --model, --workers, --rounds,
    --data-dir, --eval-every, --eval-samples), and where, how many seeds, which engine."""
    return _decorated(function, [
        OUT_OPTION,
        click.option("--seeds", default=3, show_default=True, type=click.IntRange(1),
                     help="Seeds per cell (the paper: 10). A verdict needs the seeds' "
                     "spread: 2 seldom decide one."),
        options_for(COMMAND),
        click.option("--num-workers", DEPRECATED_WORKERS, default=None, hidden=True,
                     type=click.IntRange(MIN_WORKERS),
                     help="Deprecated name of --workers."),
        engine_options,
    ])


def engine_options(function: Callable[..., None]) -> Callable[..., None]:
    """How the cells run: the engine, how many at once, how many verified."""
    return _decorated(function, [
        click.option("--engine", default="reference", show_default=True,
                     type=click.Choice(["reference", "cluster"]),
                     help="reference: the in-process engine, bit-identical to a cluster; "
                     "cluster: every cell through real ps-server/ps-worker/ps-proxy "
                     "processes."),
        click.option("--jobs", default=2, show_default=True, type=click.IntRange(1),
                     help="Cells run at once by the reference engine, one process each."),
        click.option("--cached-from", "cached_from", multiple=True,
                     type=click.Path(path_type=Path, exists=True, file_okay=False),
                     help="A results folder (results.jsonl[.gz], e.g. docs/results/paper): "
                     "its runs that are cells of this grid count as computed (repeatable). "
                     "A grid grown by seeds or sweeps then resumes from the published runs."),
        click.option("--cached-only", is_flag=True,
                     help="Run nothing: write the results and the report of the cells "
                     "already run (an unfinished grid's so far; the report counts the "
                     "others as not yet run)."),
        click.option("--verify-sample", default=0, show_default=True, type=click.IntRange(0),
                     help="Run K randomly chosen cells through the cluster too; exit 5 if a "
                     "final parameter hash differs from the reference engine's."),
    ])


@dataclass(frozen=True)
class GridRun:
    """One invocation's common options (see :func:`grid_options`)."""

    out: Path
    seeds: int
    rounds: int | None
    dataset: str
    data_dir: Path | None
    model: str | None
    num_workers: int
    eval_every: int
    eval_samples: int | None
    engine: str
    jobs: int
    verify_sample: int
    cached_from: tuple[Path, ...]
    cached_only: bool

    @classmethod
    def take(cls, values: dict[str, Any]) -> GridRun:
        """The common options out of a subcommand's ``values`` (removed from them); the
        run settings by their declarations' names."""
        run = {d.name: values.pop(d.param) for d in COMMAND.settings()}
        run["num_workers"] = _workers(run["num_workers"], values.pop(DEPRECATED_WORKERS))
        own = {f.name: values.pop(f.name) for f in fields(cls) if f.name not in run}
        return cls(**run, **own)

    def spec(self, **changes: Any) -> GridSpec:
        return GridSpec.for_dataset(self.dataset, model=self.model, seeds=self.seeds,
                                    num_workers=self.num_workers,
                                    **{"rounds": self.rounds, **changes})

    def run(self, cells: list[Cell], metric: str, grid: dict[str, Any]) -> None:
        """Run (or read) every cell, verify a sample, write the outputs of ``grid`` (a
        ``rebuild`` description); exit 5 if a verified cell differs."""
        from ps.experiments.runner import CellRun

        execute(cells, CellRun(self.out, self.data_dir, self.eval_every, self.eval_samples,
                               self.engine, self.jobs, self.cached_from,
                               self.cached_only),
                self.verify_sample, metric, grid)


def execute(cells: Sequence[Cell], how: CellRun, verify_sample: int, metric: str,
            grid: dict[str, Any]) -> None:
    """Run (or read) every cell as ``how`` says, verify ``verify_sample`` of them through
    the cluster, write results.jsonl, grid.json (``grid``: a ``rebuild`` description),
    report.md and the figures; exit 5 if a verified cell differs."""

    def start() -> None:
        from ps.experiments import runner

        started = time.monotonic()
        results = runner.run_cells(cells, how)
        checked = _verification(how.out, runner.verify_sample(
            cells, results, verify_sample, how) if verify_sample else None)
        from ps.experiments.rebuild import render, write_grid
        from ps.experiments.report import write_results

        write_results(how.out, results)
        command = shlex.join(["ps-experiment", *sys.argv[1:]])
        missing = len({c.key for c in cells}) - len({r["key"] for r in results})
        info = ReportInfo(command, time.monotonic() - started, metric, how.engine, [],
                          checked, missing)
        write_grid(how.out, grid, info)
        report = render(how.out, results, info, grid)
        click.echo(f"{len(results)} cells; report: {report}")
        if checked and not all(c["same"] for c in checked):
            differ = ", ".join(c["label"] for c in checked if not c["same"])
            raise ReferenceMismatch("the cluster and the reference engine end "
                                    f"differently: {differ}")

    run_process("experiment", ProcessOptions(out_dir=how.out), start)


@main.command(epilog=GRID_EPILOG)
@grid_options
@click.option("--rules", default=",".join(PAPER_RULES + EXTRA_RULES), show_default=True,
              help="Comma-separated rules: the table's rows.")
@click.option("--scenarios", default=",".join(SCENARIOS), show_default=True,
              help="Comma-separated scenarios: the table's columns.")
@click.option("--no-sweeps", is_flag=True, help="Skip the q and batch-size sweeps.")
def paper(rules: str, scenarios: str, no_sweeps: bool, **values: Any) -> None:
    """The paper's grid: rules x scenarios x seeds, plus the q and batch-size sweeps.

    Writes report.md (final accuracies, figures, a verdict on each of the paper's claims),
    results.jsonl (every evaluation point) and the PNG figures into --out.

    Example (the default grid, about 20 minutes on 2 cores):

        ps-experiment paper --out experiments/paper
    """
    grid = GridRun.take(values)
    spec = grid.spec(rules=_names(rules), scenarios=_names(scenarios), sweeps=not no_sweeps)
    grid.run(paper_cells(spec), recipe(spec.dataset).metric, paper_grid())


@main.command(epilog=GRID_EPILOG)
@grid_options
@click.option("--defences", default=",".join(MODERN_DEFENCES), show_default=True,
              help="Comma-separated defences, the table's rows: a rule, after a "
              "pre-aggregation chain if written PRE+RULE (nnm+trimmed-mean, "
              "arc+nnm+krum).")
@click.option("--attacks", default=",".join(MODERN_ATTACKS), show_default=True,
              help="Comma-separated Byzantine-worker attacks (none: no attack), the "
              "columns; by the first 6/20 of the workers.")
@click.option("--momenta", default=",".join(f"{b:g}" for b in MOMENTA), show_default=True,
              help="Comma-separated worker momenta beta, one table each.")
@click.option("--shards", default=4, show_default=True, type=click.IntRange(1),
              help="S: vector-level steps (NNM, Krum, clipping...) see one shard's "
              "coordinates each; --shards 1 gives them whole vectors.")
def modern(defences: str, attacks: str, momenta: str, shards: int, **values: Any) -> None:
    """The field's newer defences (pre-aggregation, centered clipping) against its newer
    attacks (ALIE, IPM, Min-Max, Min-Sum, Mimic, label flipping, Inf), with and without
    worker momentum.

    Writes report.md (one table per momentum, defences x attacks, with each defence's
    worst case), modern-grid.png and results.jsonl into --out.

    Example (1 seed, 300 rounds):

        ps-experiment modern --out experiments/modern --seeds 1
    """
    grid = GridRun.take(values)
    try:
        betas = tuple(float(b) for b in _names(momenta))
    except ValueError as e:
        raise click.BadParameter(f"not a number: {e}", param_hint="--momenta") from e
    spec = ModernSpec(grid.spec(rounds=grid.rounds or MODERN_ROUNDS, sweeps=False,
                                num_shards=shards),
                      _names(defences), _names(attacks), betas)
    try:
        cells = modern_cells(spec)
        for cell in cells[:len(spec.defences) * len(spec.attacks) * len(betas)]:
            cell.configs()  # a bad rule, attack or momentum fails here, before any run
    except (ConfigError, RuleError) as e:
        raise click.UsageError(str(e)) from e
    grid.run(cells, recipe(spec.grid.dataset).metric,
             modern_grid(spec.attacks, spec.grid.num_workers))


class GridFileError(click.ClickException):
    """A grid file refused before anything runs, or a grid directory without its
    results: its one line, exit 2."""

    exit_code = EXIT_CONFIG


@main.command("run")
@click.argument("grid_file", metavar="GRID.toml", type=click.Path(path_type=Path))
@OUT_OPTION
@options_for(INVOCATION)
@engine_options
def run_file(grid_file: Path, out: Path, engine: str, jobs: int, verify_sample: int,
             cached_from: tuple[Path, ...], cached_only: bool, **values: Any) -> None:
    """Run the grid written in GRID.toml (or a shipped grid, by its name: ps-experiment
    run heterogeneity): its keys are run settings (the flags without "--") and seeds; a
    list is an axis of the product; [[exclude]] and [[only]] tables drop combinations
    (see `ps-experiment grids` for the shipped files to copy).

    Every cell is checked before any runs. Writes report.md (final accuracy per cell,
    mean ± std over seeds; with a [report] table, a worst-case heat map and accuracy
    curves), results.jsonl and cells/ into --out, sharing the cache of the built-in grids.

    Example: ps-experiment run my-grid.toml --out experiments/mine
    """
    from ps.experiments.runner import CellRun

    if not grid_file.exists() and str(grid_file) in shipped():
        grid_file = shipped()[str(grid_file)]
    try:
        grid = load_grid(grid_file)
    except ConfigError as exc:
        raise GridFileError(str(exc)) from None
    context = click.get_current_context()
    given = {d.name: values[d.param] for d in INVOCATION.settings()
             if context.get_parameter_source(d.param) is not ParameterSource.DEFAULT}
    settings = {d.name: values[d.param] for d in INVOCATION.settings()}
    settings |= grid.invocation | given  # flag or variable > file > default
    how = CellRun(out, settings["data_dir"], settings["eval_every"], settings["eval_samples"],
                  engine, jobs, cached_from, cached_only)
    execute(grid.cells, how, verify_sample, _metric(grid), file_grid(grid))


def _metric(grid: GridFile) -> str:
    """The accuracy a grid reports: its datasets' recipe's (top-3 for CIFAR-10), top-1
    where they differ."""
    metrics = {recipe(c.run["dataset"]).metric for c in grid.cells}
    return metrics.pop() if len(metrics) == 1 else "top1"


@main.command()
@click.argument("directory", metavar="DIR",
                type=click.Path(exists=True, file_okay=False, path_type=Path))
def report(directory: Path) -> None:
    """Regenerate report.md and the figures of a finished grid in DIR (ps-experiment
    paper, modern or run) from its results.jsonl (or results.jsonl.gz), grid.json and
    verify.json alone: nothing runs and cells/ is not read.

    Example: ps-experiment report docs/results/paper
    """
    try:
        path = regenerate(directory)
    except ConfigError as exc:
        raise GridFileError(str(exc)) from None
    click.echo(f"report: {path}")


@main.command()
@click.argument("before", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("after", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--round-before", type=click.IntRange(0), default=None,
              help="Read BEFORE's runs at this round (every run cut there); default: "
              "as they ended.")
@click.option("--round-after", type=click.IntRange(0), default=None,
              help="Read AFTER's runs at this round; default: as they ended.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the tables to this markdown file; default: print them.")
def compare(before: Path, after: Path, round_before: int | None, round_after: int | None,
            out: Path | None) -> None:
    """Set the worst cases of two finished grid files (same axes, same [report]) side by
    side: each cell's worst case in BEFORE beside AFTER's, over the seeds both ran, and
    the change paired by seed with its 95 % interval. Only their results and grid.json
    are read.

    Example: ps-experiment compare docs/results/heterogeneity-long
    docs/results/heterogeneity-decay
    """
    from ps.experiments.compare import compare_lines, read_side

    try:
        lines = compare_lines(read_side(before, round_before), read_side(after, round_after))
    except ConfigError as exc:
        raise GridFileError(str(exc)) from None
    text = "\n".join(lines) + "\n"
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        click.echo(f"compared: {out}")


@main.command()
@click.argument("name", required=False)
def grids(name: str | None) -> None:
    """List the grid files shipped with the package (name, path, first line); with NAME,
    print that file, to copy and edit:

        ps-experiment grids paper > my-grid.toml
    """
    files = shipped()
    if name is None:
        for stem, path in files.items():
            first = path.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
            click.echo(f"{stem}\t{path}\t{first}")
        return
    if name not in files:
        raise click.BadParameter(f"no shipped grid {name!r}; shipped: {', '.join(files)}",
                                 param_hint="NAME")
    click.echo(files[name].read_text(encoding="utf-8"), nl=False)


def _verification(out: Path, checked: list | None) -> list | None:
    """This invocation's ``--verify-sample`` results (kept in ``verify.json``), else the
    last ones kept."""
    if checked is not None:
        (out / VERIFY_FILE).write_text(json.dumps(checked, indent=2) + "\n", encoding="utf-8")
        return checked
    return read_verification(out)


def _workers(workers: int, deprecated: int | None) -> int:
    """n from ``--workers`` or its deprecated name ``--num-workers`` (said on stderr);
    ``UsageError`` if both are given, or if n is too small for a grid."""
    if deprecated is not None:
        given = click.get_current_context().get_parameter_source("workers")
        if given is ParameterSource.COMMANDLINE:
            raise click.UsageError("give --workers only (--num-workers is its deprecated "
                                   "name)")
        click.echo("ps-experiment: --num-workers is deprecated; use --workers (-n)", err=True)
        return deprecated
    if workers < MIN_WORKERS:
        raise click.BadParameter(f"a grid needs at least {MIN_WORKERS} workers, got {workers}",
                                 param_hint="--workers")
    return workers


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


if __name__ == "__main__":
    main()
