#!/usr/bin/env python3
"""Rerun the published results (docs/results) from their grid files, timed and resumable.

    python3 scripts/rerun_results.py --out runs/rerun             # everything
    python3 scripts/rerun_results.py --out runs/rerun --cut       # the set that fits 4 h
    python3 scripts/rerun_results.py --out runs/rerun --seeds 1   # a timed sample
    python3 scripts/rerun_results.py --out runs/rerun --seeds 1 --last   # its last seed
    python3 scripts/rerun_results.py --out runs/rerun --summary   # the ledger so far

Run it again with the same flags to resume (in another session too): finished folders
are skipped, a stopped grid resumes from its cache, and ``rerun.json`` adds up the wall
time. At the end it prints each folder's minutes, what its whole grid takes at that
rate, and how many runs ended bit-identical to the published ones (those published from
this machine; ``ps/experiments/rerun.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.errors import ConfigError  # noqa: E402
from ps.experiments.rerun import (  # noqa: E402
    CUT,
    LEDGER,
    Ledger,
    published_folders,
    recompare,
    rerun,
    summary,
)


@click.command()
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Directory for the reruns (one folder each) and rerun.json.")
@click.option("--results", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=ROOT / "docs" / "results", show_default=True,
              help="The published results folders.")
@click.option("--only", "only", multiple=True, help="Rerun this folder only (repeatable).")
@click.option("--seeds", type=click.IntRange(1), default=None,
              help="Take the first K seeds of each grid (a timed sample).")
@click.option("--last", is_flag=True,
              help="With --seeds: the last K seeds (those most recently published: the "
              "runs compared bit for bit are the ones published from this machine).")
@click.option("--cut", is_flag=True,
              help=f"The set that fits 4 hours of this 2-core machine: {CUT}.")
@click.option("--jobs", type=click.IntRange(1), default=2, show_default=True,
              help="Cells run at once.")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=None, help="For the grids that read one (mnist: mnist_5k.csv.gz).")
@click.option("--summary", "summary_only", is_flag=True,
              help="Print the ledger of --out (its finished grids compared with the "
              "published runs again) and run nothing.")
def main(out: Path, results: Path, only: tuple[str, ...], seeds: int | None, last: bool,
         cut: bool, jobs: int, data_dir: Path | None, summary_only: bool) -> None:
    """Rerun docs/results from its grid files, timed into OUT/rerun.json."""
    folders = published_folders(results)
    if summary_only:
        ledger = Ledger(out / LEDGER)
        recompare(ledger, folders, out)
        click.echo("\n".join(summary(ledger)))
        return
    unknown = set(only) - {f.name for f in folders}
    if unknown:
        raise click.BadParameter(f"no such results folder: {', '.join(sorted(unknown))} "
                                 f"(there are {', '.join(f.name for f in folders)})",
                                 param_hint="--only")
    chosen = [f for f in folders if not only or f.name in only]
    if last and seeds is None:
        raise click.BadParameter("--last takes the last K seeds: give --seeds K too",
                                 param_hint="--last")
    try:
        ledger = rerun(chosen, out, seeds=seeds, cut=cut, jobs=jobs, data_dir=data_dir,
                       last=last, progress=lambda line: click.echo(line, err=True))
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from None
    click.echo("\n".join(summary(ledger)))
    if any(not e["finished"] for e in ledger.folders.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
