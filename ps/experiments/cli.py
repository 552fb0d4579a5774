"""``ps-experiment``: the paper's experiments, cached and resumable."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click

from common.process import ProcessOptions, run_process
from ps.experiments.grid import EXTRA_RULES, PAPER_RULES, SCENARIOS, GridSpec, paper_cells


@click.group()
def main() -> None:
    """Run the paper's experiments (Xie, Koyejo, Gupta 2018) as grids of cached cells."""


@main.command()
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="Output directory (cells/, results.jsonl, report.md); run again to "
              "resume: finished cells are never recomputed.")
@click.option("--seeds", default=2, show_default=True, type=click.IntRange(1),
              help="Seeds per cell (the paper: 10).")
@click.option("--rounds", default=500, show_default=True, type=click.IntRange(1))
@click.option("--dataset", default="fashion-mnist", show_default=True,
              help="mnist needs --data-dir; Fashion-MNIST is found offline.")
@click.option("--data-dir", default=None, help="Directory of the dataset's files.")
@click.option("--rules", default=",".join(PAPER_RULES + EXTRA_RULES), show_default=True)
@click.option("--scenarios", default=",".join(SCENARIOS), show_default=True)
@click.option("--no-sweeps", is_flag=True, help="Skip the q and batch-size sweeps.")
@click.option("--eval-every", default=25, show_default=True, type=click.IntRange(1))
@click.option("--eval-samples", default=None, type=click.IntRange(1),
              help="Evaluate on the first N test samples (default all).")
@click.option("--jobs", default=2, show_default=True, type=click.IntRange(1),
              help="Cells run at once, one process each.")
def paper(out: Path, seeds: int, rounds: int, dataset: str, data_dir: str | None, rules: str,
          scenarios: str, no_sweeps: bool, eval_every: int, eval_samples: int | None,
          jobs: int) -> None:
    """The paper's grid: rules x scenarios x seeds, plus the q and batch-size sweeps."""

    def start() -> None:
        from ps.experiments.report import write_report, write_results
        from ps.experiments.runner import run_cells

        spec = GridSpec(dataset=dataset, rounds=rounds, seeds=seeds,
                        rules=_names(rules), scenarios=_names(scenarios), sweeps=not no_sweeps)
        cells = paper_cells(spec)
        started = time.monotonic()
        results = run_cells(cells, out, jobs, data_dir, eval_every, eval_samples)
        write_results(out, results)
        command = shlex.join(["ps-experiment", *sys.argv[1:]])
        report = write_report(out, results, command, time.monotonic() - started)
        click.echo(f"{len(results)} cells; report: {report}")

    run_process("experiment", ProcessOptions(out_dir=out), start)


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


if __name__ == "__main__":
    main()
