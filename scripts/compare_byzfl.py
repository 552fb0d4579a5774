"""Our aggregators, pre-aggregators and attacks beside ByzFL's, and four training cells of
its aggregators driven by our engine (issue 37; ``ps/experiments/byzfl.py``). Needs
byzfl: ``pip install --no-deps byzfl`` (never let pip replace torch).

    python3 scripts/compare_byzfl.py --out docs/results/byzfl
"""

from __future__ import annotations

from pathlib import Path

import click

from ps.experiments.byzfl import CellSpec, write


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("docs/results/byzfl"),
              show_default=True, help="Directory for agreement.json and report.md.")
@click.option("--seeds", default=3, show_default=True, type=click.IntRange(1),
              help="Input seeds per pair and f.")
@click.option("--rounds", default=100, show_default=True, type=click.IntRange(0),
              help="Rounds of each training cell (0: no training cells).")
@click.option("--train-seeds", default=5, show_default=True, type=click.IntRange(2),
              help="Seeds of the training cells (0 to N-1), ours and ByzFL's paired by seed.")
def main(out: Path, seeds: int, rounds: int, train_seeds: int) -> None:
    """Compare with ByzFL; write the agreement table and the training cells."""
    command = (f"python3 scripts/compare_byzfl.py --out {out} --seeds {seeds} "
               f"--rounds {rounds} --train-seeds {train_seeds}")
    cells = CellSpec(rounds=rounds, seeds=train_seeds) if rounds else None
    click.echo(write(out, seeds, cells, command, say=click.echo))


if __name__ == "__main__":
    main()
